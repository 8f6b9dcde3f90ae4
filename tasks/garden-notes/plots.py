"""The garden's plot register, as a tool: a person's own tool, not a folder tool."""

from pydantic import BaseModel, Field

from runner.tools import Tool, ToolContext

PLOTS = {
    3: "Plot 3: free since 2026-10-01.",
    7: "Plot 7: held by Jonas Berg since 2023.",
    14: "Plot 14: held by Amara Okafor since 2024.",
}


class PlotParams(BaseModel):
    plot: int = Field(description="The plot's number")


class LookupPlot(Tool):
    name = "lookup_plot"
    description = "Look up a plot of the garden's register by its number: who holds it, or that it is free."
    Params = PlotParams
    read_only = True
    blocking = False

    def run_sync(self, args: PlotParams, ctx: ToolContext) -> str:
        return PLOTS.get(args.plot, f"There is no plot {args.plot}.")
