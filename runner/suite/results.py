"""What a suite run reports: each run's graded result, per-task summaries over the repeats,
scores per model and split, and the report that holds them (`runs/suite-*.json`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from runner.result import RunResult
from runner.suite.format import Split
from runner.suite.grading import Verdict

Provider = Literal["scripted", "local"]
ToolChoiceSetting = Literal["auto", "required", "none"]


class TaskResult(RunResult):
    """One run, one task on one model column: its `RunResult` and its grade. Tokens are
    counts, cost USD, times ms."""

    provider: Provider
    task: str
    mean_turn_ms: float
    correct: bool
    """The reply is right, and so are the files afterwards when the task grades them."""
    why_wrong: str | None = None
    """The grading rule a wrong run failed (`runner.suite.grading`): the reply's, or the end
    state's after "end state: "."""
    verdict: Verdict = "wrong"
    """correct, wrong, or abstained (the answer says the information is not there); wrong
    when the end state is."""
    shape: str = "question"
    """The task's shape (`Task.shape`)."""
    reply_verdict: Verdict | None = None
    """The reply's own verdict, apart from the files (None in reports written before)."""
    end_state_right: bool | None = None
    """The files afterwards are right (None: the task does not grade them)."""
    end_state_why: str | None = None
    """The first thing wrong with the files afterwards."""
    files_damaged: list[str] = Field(default_factory=list)
    """Files the run damaged (`runner.suite.grading.EndGrade.damaged`)."""
    suite: str = ""
    """The suite's name ("" in reports written before suites were data: the six-task suite)."""
    split: Split | None = None
    calls: int = 0
    """Tool calls the model made (valid or not)."""
    invalid_calls: int = 0
    """Calls naming an unknown tool or with arguments its schema rejects."""
    model: str = ""
    """The model column: "scripted" or the local model's name."""
    repeat: int = 1
    """Which repeat of (task, model) this run is, from 1."""
    turn_ms: list[float] = Field(default_factory=list)
    """Wall time of each turn, ms (`TurnRecord.ms`: the model call, retries included)."""
    driven_by: str = ""
    """Where the run was driven: "local pid N", or "node <Ray node id, 8 hex> pid N"."""


class TaskSummary(BaseModel):
    """One task on one model over its repeats: counts and means per run (tokens, cost USD,
    wall ms), and turn times over every turn of every repeat (ms)."""

    model: str
    provider: Provider
    task: str
    runs: int
    passed: int
    pass_rate: float
    """passed / runs."""
    statuses: dict[str, int]
    """How many runs stopped with each status."""
    turns: float
    tool_runs: float
    prompt_tokens: float
    completion_tokens: float
    cost_usd: float
    wall_ms: float
    turn_ms_mean: float
    turn_ms_p50: float
    turn_ms_p95: float


class Score(BaseModel):
    """One model column on one split (or suite): how many answers were correct, wrong and
    abstained, with the correct rate's 95% Wilson interval."""

    model: str
    split: str
    """"dev", "test", or a suite's name for a suite outside the split."""
    n: int
    correct: int
    wrong: int
    abstained: int
    correct_low: float
    correct_high: float
    shape: str = ""
    """The task shape counted ("": every shape)."""
    end_state_graded: int = 0
    """Runs whose files were graded afterwards."""
    end_state_right: int = 0
    """Of those, runs that left the files right."""
    files_damaged: int = 0
    """Files damaged over all the runs counted."""


class SuiteRef(BaseModel):
    """A suite a report ran: its name, split and folder."""

    name: str
    split: Split | None = None
    path: str
    tasks: int


class SuiteReport(BaseModel):
    suites: list[SuiteRef] = []
    """The suites run, in order (empty in reports written before suites were data)."""
    model: str | None
    """The first local model's name (None when only the scripted provider ran)."""
    model_path: str | None = None
    base_url: str | None = None
    first_turn_tool_choice: ToolChoiceSetting = "auto"
    """tool_choice sent on each local task's first turn (the manifest's value for the first local model)."""
    load_average: list[float] | None = None
    """The machine's 1, 5 and 15 minute load averages when the local columns finished."""
    local_turns: list[dict[str, float]] = []
    """Per model call of the first local column, from the server(s) started for it (GET /stats;
    in order per server, servers one after another):
    prompt_tokens, cached_prompt_tokens (KV reused), prompt_eval_tokens (evaluated), eval_tokens,
    prompt_eval_ms, eval_ms, handler_ms."""
    max_turns: int
    results: list[TaskResult]
    """One per run, by model column, then task, then repeat."""
    cancelled: bool = False
    """True when Ctrl-C stopped the suite: `results` holds the runs finished until then."""
    models: list[str] = []
    """The model columns, in order ("scripted" is the scripted provider)."""
    repeats: int = 1
    executor: Literal["local", "ray"] = "local"
    summaries: list[TaskSummary] = []
    """One per (model, task), from `summarize`."""
    scores: list[Score] = []
    """One per (model, split), from `scores`."""
    shapes: list[Score] = []
    """One per (model, split, task shape), from `scores` with `by_shape` (none when every
    task is a question)."""
    policies: dict[str, list[str]] = {}
    """The steering policies of each local column, by name (`runner.steering`)."""
    report_path: str | None = None
    """Where the Markdown report was written (the JSON and the plot sit beside it)."""
    unfinished: list[str] = []
    """Ids of runs created but not driven to a stop (the suite was cancelled): each is saved
    and continues with `runner resume ID`."""


def cancelled(result: TaskResult) -> bool:
    """A run Ctrl-C stopped before it finished (resumable, not a result)."""
    return result.status == "interrupted" and (result.reason or "").startswith("cancelled")
