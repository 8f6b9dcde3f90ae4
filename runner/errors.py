"""The error tree: every error runner reports to a user, with the exit code it maps to.

Expected endings of a run (completed, failed, limits, interruptions) are data on the state,
never exceptions. What is raised is bad input, a missing thing, a broken file or an
unreachable service, as a `RunnerError` subclass carrying its `exit_code`; the CLI prints
its message in one line. Any other exception is a bug: the CLI exits 1 with a hint to rerun
with `--debug` for the traceback.

    RunnerError (1)
    ├── UsageError (2)              bad options or arguments
    │   └── NotFound (2)            a run, model, scenario, tool or call that does not exist
    │       ├── RunNotFound, UnknownTool, UnknownScenario, NotPending
    │       └── ModelNotFound       (also a ModelError)
    │   └── MissingExtra (2)        an optional dependency is not installed (also an ImportError)
    ├── RunBusy (2)                 another process is driving the run
    ├── CorruptState (1)            a saved state or trace that cannot be read
    │   ├── StaleState              a state behind the stored one (an old copy)
    │   └── DamagedRun              a bad record mid-journal: `runner repair` rebuilds the run
    ├── StoreError (1)              the store itself (a database that cannot be reached)
    │   ├── DiskFull                the disk holding the runs is full
    │   └── LeaseLost               another driver took the run over
    ├── ProviderError (1)           the endpoint gave no usable reply (its `kind` says why)
    ├── ModelError (1)              the model catalogue
    │   ├── ManifestError, PullError, HashMismatch, ModelNotFound
    ├── TokenizerUnavailable (1)    o200k_base could not be found or seeded
    └── ServiceError (1)            a helper server (scripted provider, llama.cpp) did not start
        └── LocalServerError        the llama.cpp server, with its log tail

Each class lives here; the modules that raise them re-export the ones callers catch. A command
that drove a run exits with the code `EXIT_CODES` gives the status the run stopped with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    from runner.state import RunStatus

EXIT_CODES: dict[RunStatus, int] = {
    "completed": 0, "failed": 1, "max_turns_exceeded": 3, "budget_exceeded": 3, "interrupted": 3,
    "running": 3,
}
"""Exit code per run status: 0 completed; 1 failed; 3 stopped resumably (max turns, budget,
interrupted: approval, cancel, provider unavailable). A test checks every `RunStatus` has one."""


class RunnerError(Exception):
    """Base of every error runner reports to a user; `exit_code` is the CLI's exit status."""

    exit_code: ClassVar[int] = 1


class UsageError(RunnerError, ValueError):
    """Bad input from the user (options, arguments, a verdict for the wrong call)."""

    exit_code = 2


class MissingExtra(UsageError, ImportError):
    """An optional dependency a feature needs is not installed; the message names the extra
    that installs it (pip install 'runner[otel]')."""


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


class StoreError(RunnerError):
    """A run store problem that is not about one run's data (e.g. the database is unreachable)."""


class StaleState(CorruptState):
    """The state does not follow the stored one (its `seq` is behind): an old copy, or a
    writer that missed newer history. `--force` may override, and the override is traced."""


class DamagedRun(CorruptState):
    """A record in the middle of the run's journal is unreadable (fails its checksum, is not
    JSON, or does not follow the one before it): the run is listed as `damaged` and refuses to
    resume until `runner repair RUN_ID` rebuilds it from its last good record."""


class DiskFull(StoreError):
    """The disk holding the runs is full: the run stops `interrupted` (committed transitions
    kept) and resumes once there is space."""


class LeaseLost(StoreError):
    """This process no longer holds the run's lease (another driver claimed it: a newer
    epoch); it must stop writing."""


ErrorKind = Literal["unavailable", "auth", "not_found", "invalid_request", "context_overflow", "bad_endpoint"]
"""unavailable: transient, retried (after the last retry the loop stops `interrupted`);
the others are deterministic and stop the run `failed`. bad_endpoint: the base URL answers,
but not as a chat-completions API (an HTML page or other non-JSON body in a 200, HTTP 405/501):
a misconfiguration, reported with a hint."""


class ProviderError(RunnerError):
    """The provider could not give a usable reply.

    Attributes:
        status: HTTP status, or None for transport and decoding errors.
        retryable: whether another attempt could succeed (after all retries: False).
        kind: the triage class (see `ErrorKind`).
        retries: attempts made after the first before this error was raised.
        details: numbers the provider sent with its error (e.g. n_ctx, n_prompt_tokens).
        retry_after_s: the provider's Retry-After, seconds, if any.
    """

    def __init__(self, message: str, status: int | None = None, retryable: bool = False,
                 kind: ErrorKind | None = None, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.kind: ErrorKind = kind or ("unavailable" if retryable else "invalid_request")
        self.retries = 0
        self.details = details
        self.retry_after_s: float | None = None


class ModelError(RunnerError, RuntimeError):
    """Base class for model catalogue errors; the message is one line a user can act on."""


class ManifestError(ModelError):
    """The manifest file is missing, unreadable or invalid."""


class ModelNotFound(ModelError, NotFound):
    """The model is unknown, or known but not on disk (the message says how to get it)."""


class PullError(ModelError):
    """A download failed; nothing partial is left under the model's final path."""


class HashMismatch(ModelError):
    """A file's sha256 differs from the pinned or recorded digest; a downloaded copy is deleted.

    Attributes:
        name: manifest name of the model.
        expected: the digest from the manifest (or pulled.json), lowercase hex.
        actual: the digest of the bytes received, lowercase hex.
    """

    def __init__(self, name: str, expected: str, actual: str, deleted: bool = True) -> None:
        fate = "the downloaded file was deleted" if deleted else "reinstall the package"
        super().__init__(
            f"sha256 mismatch for model {name!r}: expected {expected}, got {actual}; {fate}"
        )
        self.name = name
        self.expected = expected
        self.actual = actual


class TokenizerUnavailable(RunnerError):
    """o200k_base could neither be found in tiktoken's cache nor seeded from a verified copy."""


class LocalServerError(ServiceError):
    """The local server could not start or stopped unexpectedly; the message has its log tail."""
