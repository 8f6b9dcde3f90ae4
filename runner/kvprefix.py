"""Saved KV state of a model's shared prompt prefix, so a cold local server's first turn starts warm.

Every run of a model on the suite starts with the same system turn (the system prompt and the
tool schemas, `runner.chat_adapter.render_segments`' first segment): several hundred tokens a
fresh server evaluates before the first reply. `PrefixStore` saves the KV entries of that
segment to disk the first time a server evaluates it and loads them into the next fresh
server instead of evaluating it again (llama.cpp's per-sequence state: `llama_state_seq_get_data`
/ `llama_state_seq_set_data`).

The saved entries are exactly what evaluating the segment computes: it is saved right after
being evaluated as one `Llama.eval` call into an empty cache, which is how a cold server
evaluates it, so the replies are byte-identical to a cold evaluation
(`scripts/determinism_local.py` compares them).

A file is keyed by sha256 over the model file's sha256, the llama-cpp-python version, the
context size and the segment's token ids; it holds a JSON header line (the token ids, to check
on load) and the state bytes. The folder is bounded: past `max_bytes`, the least recently used
files are removed; `usage()` reports files, bytes, hits and misses.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llama_cpp import Llama

DEFAULT_MAX_MB = 256
"""Default bound of the prefix folder, MiB."""
MIN_TOKENS = 32
"""Shorter prefixes are not worth a file: evaluating them takes about as long as reading one."""


def default_directory() -> Path:
    """`runner.tokens.cache_root()`/kv-prefix ($RUNNER_CACHE_DIR, else ~/.cache/runner)."""
    from runner.tokens import cache_root

    return cache_root() / "kv-prefix"


def file_sha256(path: Path, memo_dir: Path) -> str:
    """The sha256 of a model file, hashed once per (path, size, mtime) and remembered in
    `memo_dir` (a 1 GB GGUF takes seconds to hash)."""
    st = path.stat()
    ident = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:32]
    memo = memo_dir / f"sha256-{ident}.txt"
    try:
        known = memo.read_text().strip()
        if len(known) == 64:
            return known
    except OSError:
        pass
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    value = digest.hexdigest()
    try:
        memo_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        _write_atomic(memo, value.encode())
    except OSError:
        pass
    return value


@dataclass
class PrefixStore:
    """Saved prefix KV states for one model, in `directory`, at most `max_bytes` in all.

    Args:
        directory: where the files live (created on the first save).
        model_sha256: the GGUF's sha256 (see `file_sha256`).
        n_ctx: the context size the server runs with (part of the key).
        max_bytes: bound of the folder's `.kv` files, bytes.
    """

    directory: Path
    model_sha256: str
    n_ctx: int
    max_bytes: int = DEFAULT_MAX_MB << 20
    hits: int = 0
    misses: int = 0
    saved: int = 0

    def key(self, tokens: list[int]) -> str:
        import llama_cpp

        head = f"{self.model_sha256}|llama-cpp-python {llama_cpp.__version__}|n_ctx {self.n_ctx}|"
        return hashlib.sha256(head.encode() + json.dumps(tokens).encode()).hexdigest()

    def path(self, tokens: list[int]) -> Path:
        return self.directory / f"{self.model_sha256[:16]}-{self.key(tokens)}.kv"

    def latest(self) -> list[int] | None:
        """The tokens of this model's most recently used saved prefix, or None."""
        newest: tuple[int, Path] | None = None
        for p in self.directory.glob(f"{self.model_sha256[:16]}-*.kv") if self.directory.is_dir() else []:
            try:
                mtime = p.stat().st_mtime_ns
            except OSError:
                continue
            if newest is None or mtime > newest[0]:
                newest = (mtime, p)
        if newest is None:
            return None
        try:
            with newest[1].open("rb") as f:
                tokens = json.loads(f.readline()).get("tokens")
        except (OSError, ValueError):
            return None
        return tokens if isinstance(tokens, list) and all(isinstance(t, int) for t in tokens) else None

    def restore(self, llama: Llama, tokens: list[int]) -> bool:
        """Load the saved KV entries of `tokens` as the whole of `llama`'s sequence 0 (positions
        0..len-1) and set its token count; False when none are saved or they do not load."""
        if len(tokens) < MIN_TOKENS:
            return False
        path = self.path(tokens)
        try:
            data = path.read_bytes()
        except OSError:
            self.misses += 1
            return False
        header, _, state = data.partition(b"\n")
        try:
            ok = json.loads(header).get("tokens") == tokens
        except ValueError:
            ok = False
        if not ok or not state or not _set_sequence(llama, state):
            self.misses += 1
            path.unlink(missing_ok=True)
            return False
        llama.n_tokens = len(tokens)
        llama.input_ids[: len(tokens)] = tokens
        os.utime(path)  # recently used: removed last
        self.hits += 1
        return True

    def save(self, llama: Llama, tokens: list[int]) -> None:
        """Save `llama`'s sequence 0, which must hold exactly `tokens`, evaluated as one batch
        into an empty cache; then bound the folder. Best effort: a full or read-only disk
        only costs the next cold start the evaluation."""
        if len(tokens) < MIN_TOKENS or llama.n_tokens != len(tokens):
            return
        path = self.path(tokens)
        if path.exists():
            return
        state = _get_sequence(llama)
        if not state:
            return
        header = json.dumps({"tokens": tokens, "model_sha256": self.model_sha256, "n_ctx": self.n_ctx})
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            _write_atomic(path, header.encode() + b"\n" + state)
        except OSError:
            return
        self.saved += 1
        self.trim()

    def files(self) -> list[Path]:
        try:
            return [p for p in self.directory.iterdir() if p.suffix == ".kv"]
        except OSError:
            return []

    def trim(self) -> None:
        """Remove the least recently used files until the folder fits `max_bytes`."""
        entries = []
        for p in self.files():
            try:
                st = p.stat()
            except OSError:
                continue
            entries.append((st.st_mtime_ns, st.st_size, p))
        total = sum(size for _, size, _ in entries)
        for _, size, p in sorted(entries):
            if total <= self.max_bytes:
                break
            p.unlink(missing_ok=True)
            total -= size

    def usage(self) -> dict[str, Any]:
        """{"dir", "files", "bytes", "max_bytes", "hits", "misses", "saved"} (this server's counts)."""
        sizes = []
        for p in self.files():
            try:
                sizes.append(p.stat().st_size)
            except OSError:
                pass
        return {"dir": str(self.directory), "files": len(sizes), "bytes": sum(sizes), "max_bytes": self.max_bytes,
                "hits": self.hits, "misses": self.misses, "saved": self.saved}


def _get_sequence(llama: Llama) -> bytes:
    import llama_cpp

    ctx = llama._ctx.ctx
    size = int(llama_cpp.llama_state_seq_get_size(ctx, 0))
    if size <= 0:
        return b""
    buf = (ctypes.c_uint8 * size)()
    written = int(llama_cpp.llama_state_seq_get_data(ctx, buf, size, 0))
    return bytes(buf)[:written] if written > 0 else b""


def _set_sequence(llama: Llama, state: bytes) -> bool:
    import llama_cpp

    llama.n_tokens = 0
    llama._ctx.kv_cache_seq_rm(-1, 0, -1)  # an empty cache, as a cold server's
    buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
    return int(llama_cpp.llama_state_seq_set_data(llama._ctx.ctx, buf, len(state), 0)) > 0


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
