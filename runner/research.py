"""The `research` tool: a whole child run behind one tool call.

The child has its own transcript (the parent only sees its summary), its own turn and
budget limits (a runaway child cannot spend the parent's budget), and the parent's Stop
signal (one cancel stops the tree). Its cost is added to the parent's spend, and its
run id is derived from the parent's run id and call id, so a resumed parent resumes the
same child instead of paying for a new one.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from runner.state import RunConfig, new_run
from runner.tools import ListFiles, ReadFile, ScanArchive, Tool, ToolContext, ToolError

RESEARCH_SYSTEM = (
    "You are a research assistant. Use the tools to answer the question, then reply with a "
    "short summary of what you found."
)


class ResearchParams(BaseModel):
    question: str = Field(description="One question to investigate")


class Research(Tool):
    """Runs a child agent on `question` with read-only tools; returns its answer.

    Args:
        parent: the parent's config; the child reuses its base URL and prices.
        parent_run_id: recorded on the child and used to derive the child's run id.
    """

    name = "research"
    description = "Investigate one question with a helper agent and return a short summary."
    Params = ResearchParams
    read_only = True

    def __init__(self, parent: RunConfig, parent_run_id: str) -> None:
        self.parent = parent
        self.parent_run_id = parent_run_id

    async def run(self, args: BaseModel, ctx: ToolContext) -> str:
        from runner import loop, store
        from runner.trace import Tracer

        assert isinstance(args, ResearchParams) and ctx.runtime is not None
        rt = ctx.runtime
        child_id = f"{self.parent_run_id}.{ctx.call_id}"
        try:
            child = store.load(rt.runs_root, child_id) if rt.runs_root else None
        except store.RunNotFound:
            child = None
        if child is None:
            config = self.parent.model_copy(update={
                "model": self.parent.research_model or self.parent.model,
                "max_turns": self.parent.research_max_turns,
                "max_budget_usd": self.parent.research_max_budget_usd,
                "tools": ["list_files", "read_file", "scan_archive"],
            })
            child = new_run(args.question, config, system=RESEARCH_SYSTEM, run_id=child_id,
                            parent_run_id=self.parent_run_id)
        spent_before = child.cost_usd
        child_rt = loop.Runtime(
            client=rt.client, tools=[ListFiles(), ReadFile(), ScanArchive()], workspace=rt.workspace,
            runs_root=rt.runs_root, cancel=ctx.cancel, on_progress=rt.on_progress,
            tracer=Tracer(store.trace_path(rt.runs_root, child_id) if rt.runs_root else None),
        )
        try:
            child = await loop.run(child, child_rt)
        finally:
            child_rt.tracer.close()
            ctx.child_run_id = child_id
            ctx.child_cost_usd = child.cost_usd - spent_before
        if child.status == "interrupted" and ctx.cancel.is_cancelled:
            from runner.cancel import Cancelled

            raise Cancelled(ctx.cancel.reason or "cancelled")
        if child.status == "completed":
            return child.answer
        partial = next((m.content for m in reversed(child.messages) if m.role == "tool" and m.content), "")
        raise ToolError(
            f"the research helper stopped early ({child.status}: {child.reason}); "
            f"last thing it read: {partial[:300] or 'nothing'}"
        )
