"""A stand-in for the Hugging Face Hub's file URLs, so downloads are tested without a network.

It speaks just enough of the hub for `huggingface_hub.hf_hub_download` (2.x) to fetch a file
the way it fetches an LFS-stored GGUF from huggingface.co:

- ``HEAD /{repo_id}/resolve/{revision}/{filename}`` answers ``302`` with the headers the client
  reads for metadata: ``X-Repo-Commit`` (40 hex), ``X-Linked-Etag`` (the file's sha256),
  ``X-Linked-Size``, ``ETag`` and a ``Location`` on another origin (``localhost`` instead of
  ``127.0.0.1``), which the client treats as a CDN and does not follow on HEAD.
- ``GET /cdn/{sha256}`` serves the bytes, honouring ``Range: bytes=N-`` with ``206`` and
  ``Content-Range``. Faults can be queued per GET: ``"drop"`` sends the headers and half of the
  body, then closes the socket; ``"503"`` answers 503.
- Unknown files get ``404`` with ``X-Error-Code: EntryNotFound``, as the hub does.

With ``redirect=False`` the resolve URL serves the bytes itself (the small-file path).

Run by hand to try ``runner models pull`` against it::

    python tests/hubstub.py Qwen/Qwen2.5-0.5B-Instruct-GGUF qwen2.5-0.5b-instruct-q4_k_m.gguf FILE
    HF_ENDPOINT=http://127.0.0.1:PORT runner models pull qwen2.5-0.5b-instruct
"""

from __future__ import annotations

import argparse
import hashlib
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_CDN = re.compile(r"^/cdn/(?P<sha>[0-9a-f]{64})$")
_RANGE = re.compile(r"^bytes=(\d+)-$")


@dataclass(frozen=True)
class StubFile:
    """One served file: its bytes (in memory, or read from `path` on demand) and digest."""

    sha256: str
    size: int
    data: bytes | None = None
    path: Path | None = None

    def read(self, start: int, end: int) -> bytes:
        """Bytes [start, end) of the file."""
        if self.data is not None:
            return self.data[start:end]
        assert self.path is not None
        with self.path.open("rb") as f:
            f.seek(start)
            return f.read(end - start)


@dataclass(frozen=True)
class Seen:
    """One request the stub received (for assertions)."""

    method: str
    path: str
    range: str | None


@dataclass
class HubStub:
    """A threaded HTTP server on loopback; use as a context manager.

    Attributes:
        faults: queued faults consumed one per file GET, in order ("drop", "503").
        requests: every request received, in order.
        redirect: whether resolve URLs redirect to the fake CDN origin (as for LFS files).
    """

    redirect: bool = True
    faults: list[str] = field(default_factory=list)
    requests: list[Seen] = field(default_factory=list)
    _files: dict[tuple[str, str, str], StubFile] = field(default_factory=dict)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add_file(
        self,
        repo_id: str,
        filename: str,
        data: bytes | None = None,
        *,
        path: Path | None = None,
        revision: str = "main",
    ) -> StubFile:
        """Serve `data` (or the file at `path`) as `filename` in `repo_id` at `revision`."""
        if (data is None) == (path is None):
            raise ValueError("give exactly one of data or path")
        if data is not None:
            stub = StubFile(hashlib.sha256(data).hexdigest(), len(data), data=data)
        else:
            assert path is not None
            digest = hashlib.sha256()
            with path.open("rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
            stub = StubFile(digest.hexdigest(), path.stat().st_size, path=path)
        self._files[(repo_id, revision, filename)] = stub
        return stub

    @property
    def port(self) -> int:
        assert self._server is not None, "stub not started"
        return self._server.server_address[1]

    @property
    def endpoint(self) -> str:
        """The value for HF_ENDPOINT / `endpoint=`: ``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def file_gets(self) -> list[Seen]:
        """The GET requests that fetched file bytes."""
        return [r for r in self.requests if r.method == "GET"]

    def start(self) -> HubStub:
        stub = self

        class Handler(_Handler):
            hub = stub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> HubStub:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _lookup(self, repo: str, rev: str, filename: str) -> StubFile | None:
        return self._files.get((repo, rev, filename))

    def _by_sha(self, sha: str) -> StubFile | None:
        return next((f for f in self._files.values() if f.sha256 == sha), None)

    def _next_fault(self) -> str | None:
        with self._lock:
            return self.faults.pop(0) if self.faults else None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: HubStub

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet: tests read `hub.requests` instead

    def do_HEAD(self) -> None:
        self._dispatch(send_body=False)

    def do_GET(self) -> None:
        self._dispatch(send_body=True)

    def _dispatch(self, send_body: bool) -> None:
        path = self.path.split("?", 1)[0]
        self.hub.requests.append(Seen(self.command, path, self.headers.get("Range")))
        if m := _RESOLVE.match(path):
            stub = self.hub._lookup(m["repo"], m["rev"], m["file"])
            if stub is None:
                self._not_found()
            elif self.hub.redirect:
                self._redirect(stub)
            else:
                self._serve(stub, send_body, linked=True)
        elif m := _CDN.match(path):
            stub = self.hub._by_sha(m["sha"])
            if stub is None:
                self._not_found()
            else:
                self._serve(stub, send_body, linked=False)
        else:
            self._not_found()

    def _not_found(self) -> None:
        body = b'{"error": "Entry not found"}'
        self.send_response(404)
        self.send_header("X-Error-Code", "EntryNotFound")
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _hub_headers(self, stub: StubFile) -> None:
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("X-Linked-Etag", f'"{stub.sha256}"')
        self.send_header("X-Linked-Size", str(stub.size))
        self.send_header("ETag", f'"{stub.sha256}"')

    def _redirect(self, stub: StubFile) -> None:
        self.send_response(302)
        self._hub_headers(stub)
        self.send_header("Location", f"http://localhost:{self.hub.port}/cdn/{stub.sha256}")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _serve(self, stub: StubFile, send_body: bool, linked: bool) -> None:
        fault = self.hub._next_fault() if send_body else None
        if fault == "503":
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        start = 0
        if (requested := self.headers.get("Range")) and (m := _RANGE.match(requested)):
            start = min(int(m.group(1)), stub.size)
        self.send_response(206 if start else 200)
        if linked:
            self._hub_headers(stub)
        else:
            self.send_header("ETag", f'"{stub.sha256}"')
        if start:
            self.send_header("Content-Range", f"bytes {start}-{stub.size - 1}/{stub.size}")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(stub.size - start))
        self.end_headers()
        if not send_body:
            return
        end = start + (stub.size - start) // 2 if fault == "drop" else stub.size
        self._write(stub, start, end)
        if fault == "drop":
            # Cut the connection mid-body: the client sees fewer bytes than Content-Length.
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True

    def _write(self, stub: StubFile, start: int, end: int) -> None:
        step = 1 << 20
        for offset in range(start, end, step):
            self.wfile.write(stub.read(offset, min(offset + step, end)))


def main() -> None:
    """Serve one file until interrupted, printing the endpoint to use as HF_ENDPOINT."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo_id")
    parser.add_argument("filename")
    parser.add_argument("file", type=Path)
    args = parser.parse_args()
    with HubStub() as hub:
        hub.add_file(args.repo_id, args.filename, path=args.file)
        print(f"HF_ENDPOINT={hub.endpoint}", flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
