"""The error tree: every error runner reports to a user, with the exit code it maps to.

Expected endings of a run (completed, failed, limits, interruptions) are data on the state,
never exceptions. What is raised is bad input, a missing thing, a broken file or an
unreachable service, as a `RunnerError` subclass carrying its `exit_code`; the CLI prints
its message in one line. Any other exception is a bug: the CLI exits 1 with a hint to rerun
with `--debug` for the traceback.

    RunnerError (1)
    ├── UsageError (2)            bad options or arguments
    │   └── NotFound (2)          a run, model, scenario, tool or call that does not exist
    │       ├── RunNotFound, UnknownTool, UnknownScenario, NotPending
    ├── RunBusy (2)               another process is driving the run
    ├── CorruptState (1)          a saved state or trace that cannot be read
    ├── ProviderError (1)         runner.client: the endpoint gave no usable reply
    ├── ModelError (1)            runner.models: manifest, download, checksum
    └── ServiceError (1)          a helper server (scripted provider, llama.cpp) did not start
"""

from __future__ import annotations

from typing import ClassVar


class RunnerError(Exception):
    """Base of every error runner reports to a user; `exit_code` is the CLI's exit status."""

    exit_code: ClassVar[int] = 1


class UsageError(RunnerError, ValueError):
    """Bad input from the user (options, arguments, a verdict for the wrong call)."""

    exit_code = 2


class NotFound(UsageError, LookupError):
    """The user named something that does not exist."""


class RunNotFound(NotFound):
    """No saved run with that id."""


class UnknownTool(NotFound):
    """A tool name that is not in the registry (`runner.catalog.NAMES`)."""


class UnknownScenario(NotFound):
    """A scripted scenario that does not exist."""


class NotPending(NotFound):
    """A verdict (approve/reject) for a call id that is not a pending tool call of the run."""


class RunBusy(RunnerError):
    """Another live process is driving the run; this one must not."""

    exit_code = 2


class CorruptState(RunnerError):
    """A saved state or trace exists but cannot be read (or is of a newer format)."""


class ServiceError(RunnerError, RuntimeError):
    """A helper server runner starts (the scripted provider, llama.cpp) failed to start or died."""
