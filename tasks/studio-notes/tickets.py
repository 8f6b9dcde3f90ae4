"""The studio's ticket tracker, as a tool: a person's own tool, not a folder tool."""

from pydantic import BaseModel, Field

from runner.tools import Tool, ToolContext

TICKETS = {
    "STU-9": "STU-9 'Order new desk lamps': closed on 2026-11-28 by Tomas.",
    "STU-12": "STU-12 'Replace the printer toner': open, assigned to Priya.",
    "STU-15": "STU-15 'Book the winter party venue': open, not assigned.",
}


class TicketParams(BaseModel):
    key: str = Field(description="The ticket's key, e.g. STU-1")


class LookupTicket(Tool):
    name = "lookup_ticket"
    description = "Look up a ticket of the studio's tracker by its key: its title and status."
    Params = TicketParams
    read_only = True
    blocking = False

    def run_sync(self, args: TicketParams, ctx: ToolContext) -> str:
        return TICKETS.get(args.key.strip().upper(), f"There is no ticket {args.key}.")
