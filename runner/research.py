"""The `research` tool: a whole child run behind one tool call.

The child has its own transcript (the parent only sees its summary), its own turn and
budget limits (a runaway child cannot spend the parent's budget), and the parent's Stop
signal (one cancel stops the tree). Its run id is derived from the parent's run id and the
call id, so a resumed parent resumes the same child instead of paying for a new one. The
tool only builds the child's state and hands it to `ctx.spawn`; driving, saving and tracing
the child, and adding its cost to the parent, happen where runs are wired.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field

from runner.cancel import Cancelled
from runner.state import RunConfig, new_run
from runner.tools import Tool, ToolContext, ToolError

RESEARCH_SYSTEM = (
    "You are a research assistant. Use the tools to answer the question, then reply with a "
    "short summary of what you found."
)


class ResearchParams(BaseModel, defer_build=True):
    question: str = Field(description="One question to investigate")


class Research(Tool):
    """Runs a child agent on `question`; returns its answer.

    Args:
        parent: the parent's config; the child reuses its base URL and prices.
        child_tools: the tool names offered to the child (the catalog's read-only tools).
    """

    name = "research"
    description = "Investigate one question with a helper agent and return a short summary."
    Params = ResearchParams
    read_only = True

    def __init__(self, parent: RunConfig, child_tools: Sequence[str]) -> None:
        self.parent = parent
        self.child_tools = list(child_tools)

    async def run(self, args: BaseModel, ctx: ToolContext) -> str:
        assert isinstance(args, ResearchParams)
        if ctx.spawn is None:
            raise ToolError("the research helper is not available in this run")
        parent = self.parent
        config = parent.model_copy(update={
            "endpoint": parent.endpoint.model_copy(update={"model": parent.research_model or parent.endpoint.model}),
            "limits": parent.limits.model_copy(update={"max_turns": parent.research_max_turns,
                                                       "max_budget_usd": parent.research_max_budget_usd}),
            "tools": self.child_tools,
        })
        child = new_run(args.question, config, system=RESEARCH_SYSTEM,
                        run_id=f"{ctx.run_id}.{ctx.call_id}", parent_run_id=ctx.run_id)
        child = await ctx.spawn(child)
        if child.status == "interrupted" and ctx.cancel.is_cancelled:
            raise Cancelled(ctx.cancel.reason or "cancelled")
        if child.status == "completed":
            return child.answer
        partial = next((m.content for m in reversed(child.messages) if m.role == "tool" and m.content), "")
        raise ToolError(
            f"the research helper stopped early ({child.status}: {child.reason}); "
            f"last thing it read: {partial[:300] or 'nothing'}"
        )
