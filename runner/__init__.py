"""runner: a local-model agent runner on CPU.

One loop (`runner.loop.run`) drives an agent over an OpenAI-compatible chat-completions
endpoint: the scripted provider (`runner.scripted`) or an embedded llama.cpp server
(`runner.local`). The run is one serializable `RunState`; it stops in exactly one of five
ways, recorded as data.

Importing this package does no work: the public names below load their modules on first
access, and heavy modules (llama_cpp, huggingface_hub, tiktoken, rich) load where used.
"""

from __future__ import annotations

import gc
import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runner.cancel import CancelToken
    from runner.endpoints import Endpoint
    from runner.errors import RunnerError
    from runner.harness import execute
    from runner.loop import Runtime, approve, reject, run
    from runner.scripted import scripted_provider
    from runner.state import Interruption, Limits, RunConfig, RunState, RunStatus, new_run, pending
    from runner.tools import PermanentToolError, Spawner, Tool, ToolContext, ToolError

_EXPORTS = {
    "CancelToken": "runner.cancel", "Endpoint": "runner.endpoints", "Limits": "runner.state",
    "execute": "runner.harness", "scripted_provider": "runner.scripted",
    "Runtime": "runner.loop", "approve": "runner.loop", "pending": "runner.state",
    "reject": "runner.loop", "run": "runner.loop",
    "Interruption": "runner.state", "RunConfig": "runner.state", "RunState": "runner.state",
    "RunStatus": "runner.state", "new_run": "runner.state",
    "PermanentToolError": "runner.tools", "Tool": "runner.tools", "ToolContext": "runner.tools",
    "ToolError": "runner.tools", "Spawner": "runner.tools",
    "RunnerError": "runner.errors",
}
__all__ = [
    "CancelToken",
    "Endpoint",
    "Interruption",
    "Limits",
    "PermanentToolError",
    "RunConfig",
    "RunState",
    "RunStatus",
    "RunnerError",
    "Runtime",
    "Spawner",
    "Tool",
    "ToolContext",
    "ToolError",
    "approve",
    "execute",
    "new_run",
    "pending",
    "reject",
    "run",
    "scripted_provider",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'runner' has no attribute {name!r}")
    if gc.isenabled():  # what an import makes (modules, classes) lives on: no point collecting it meanwhile
        gc.disable()
        try:
            return getattr(importlib.import_module(module), name)
        finally:
            gc.enable()
    return getattr(importlib.import_module(module), name)
