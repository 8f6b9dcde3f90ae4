"""runner: a local-model agent runner on CPU.

One loop (`runner.loop.run`) drives an agent over an OpenAI-compatible chat-completions
endpoint: the scripted provider (`runner.scripted`) or an embedded llama.cpp server
(`runner.local`). The run is one serializable `RunState`; it stops in exactly one of five
ways, recorded as data. Importing this package does no work: heavy modules (llama_cpp,
huggingface_hub, tiktoken, rich) load where they are used.
"""

from runner.cancel import CancelToken
from runner.loop import Runtime, approve, pending, reject, run
from runner.state import Interruption, RunConfig, RunState, RunStatus, new_run
from runner.tools import PermanentToolError, Tool, ToolContext, ToolError

__all__ = [
    "CancelToken", "Interruption", "PermanentToolError", "RunConfig", "RunState", "RunStatus",
    "Runtime", "Tool", "ToolContext", "ToolError", "approve", "new_run", "pending", "reject", "run",
]
__version__ = "0.1.0"
