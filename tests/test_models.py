"""Model catalogue and pulls: the manifest, resolve/default selection, and downloads through a
local stand-in for the Hugging Face Hub (tests/hubstub.py), including a dropped connection
(resumed by huggingface-hub), a dead download (clean failure), a digest mismatch, and a pulled
model actually served by the embedded llama.cpp server."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from runner import models
from runner.errors import HashMismatch, ManifestError, ModelNotFound, PullError
from runner.local import LocalServer
from runner.models import Manifest, ModelEntry

try:
    from tests.hubstub import HubStub
except ImportError:  # pytest put tests/ itself on sys.path
    from hubstub import HubStub  # type: ignore[no-redef]

REPO = "Qwen/Qwen2.5-0.5B-Instruct-GGUF"
FILENAME = "qwen2.5-0.5b-instruct-q4_k_m.gguf"
QWEN = "qwen2.5-0.5b-instruct"
BIG = 24 * 1024 * 1024  # > huggingface-hub's 10 MiB read chunk, so a resume starts mid-file


def payload(size: int, seed: int = 0) -> bytes:
    """Deterministic fake GGUF bytes."""
    block = hashlib.sha256(f"block-{seed}".encode()).digest() * 2048  # 64 KiB
    return (b"GGUF" + block * (size // len(block) + 1))[:size]


def manifest_with(sha256: str | None, size_bytes: int | None = None) -> Manifest:
    """The checked-in manifest with the Qwen entry's digest replaced."""
    real = models.load_manifest()
    entries = [
        m.model_copy(update={"sha256": sha256, "size_bytes": size_bytes}) if m.name == QWEN else m
        for m in real.models
    ]
    return real.model_copy(update={"models": entries})


def leftovers(directory: Path) -> list[Path]:
    """Partial or staged files anywhere under the models dir."""
    return [
        p
        for p in directory.rglob("*")
        if p.is_file()
        and (p.suffix == ".incomplete" or (models.STAGING_DIRNAME in p.parts and p.suffix == ".gguf"))
    ]


def pull_via(hub: HubStub, manifest: Manifest, directory: Path) -> Path:
    """Pull the Qwen entry of `manifest` through the stand-in hub, without a progress bar."""
    return models.pull(QWEN, False, manifest=manifest, directory=directory, endpoint=hub.endpoint)


@pytest.fixture
def hub() -> Iterator[HubStub]:
    with HubStub() as stub:
        yield stub


# --- manifest, resolve, default -----------------------------------------------------------


def test_checked_in_manifest_is_valid() -> None:
    manifest = models.load_manifest()
    assert manifest.default == "qwen2.5-coder-1.5b-instruct"
    qwen = manifest.entry("qwen2.5-0.5b-instruct")
    assert (qwen.repo_id, qwen.filename, qwen.quantization) == (REPO, FILENAME, "Q4_K_M")
    smol = manifest.entry(manifest.fallback)
    assert smol.source == "package" and smol.sha256 is not None and smol.size_bytes


def test_manifest_errors_are_one_clear_line(tmp_path: Path) -> None:
    bad = tmp_path / "manifest.json"
    bad.write_text(json.dumps({"default": "a", "fallback": "a", "models": [{"name": "a"}]}))
    with pytest.raises(ManifestError, match="invalid model manifest"):
        models.load_manifest(bad)
    with pytest.raises(ManifestError, match="cannot read"):
        models.load_manifest(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="needs repo_id"):
        ModelEntry(name="x", source="hub", filename="x.gguf", quantization="Q4_0")


def test_packaged_smollm2_resolves_and_verifies_without_download() -> None:
    path = models.resolve("smollm2-135m-instruct")
    assert path.is_file() and path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert models.pull("smollm2-135m-instruct", progress=False) == path  # hashes, no network


def test_resolve_absent_hub_model_names_the_pull_command(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound, match=re.escape("runner models pull qwen2.5-0.5b-instruct")):
        models.resolve("qwen2.5-0.5b-instruct", directory=tmp_path)
    with pytest.raises(ModelNotFound, match=r"unknown model 'nope'.*smollm2-135m-instruct"):
        models.resolve("nope", directory=tmp_path)


def test_resolve_accepts_a_gguf_path(tmp_path: Path) -> None:
    gguf = tmp_path / "mine.gguf"
    gguf.write_bytes(b"GGUF")
    assert models.resolve(str(gguf)) == gguf.resolve()


def test_default_is_qwen_when_present_else_packaged_smollm2(tmp_path: Path) -> None:
    name, path = models.default_local_model(directory=tmp_path)
    assert name == "smollm2-135m-instruct" and path.is_file()
    (tmp_path / FILENAME).write_bytes(b"GGUF")  # the hub Qwen is not the default
    assert models.default_local_model(directory=tmp_path)[0] == "smollm2-135m-instruct"
    coder = models.load_manifest().entry("qwen2.5-coder-1.5b-instruct")
    (tmp_path / coder.filename).write_bytes(b"GGUF")
    assert models.default_local_model(directory=tmp_path) == (coder.name, tmp_path / coder.filename)


def test_list_models_reports_presence(tmp_path: Path) -> None:
    rows = {r.name: r for r in models.list_models(directory=tmp_path)}
    assert not rows["qwen2.5-0.5b-instruct"].present
    assert rows["qwen2.5-0.5b-instruct"].path == tmp_path / FILENAME
    smol = rows["smollm2-135m-instruct"]
    assert smol.present and smol.pinned and smol.size_bytes == 98362432


# --- pulls through the hub stand-in ---------------------------------------------------------


def test_pull_downloads_verifies_and_skips_when_present(hub: HubStub, tmp_path: Path) -> None:
    data = payload(256 * 1024)
    stub = hub.add_file(REPO, FILENAME, data)
    manifest = manifest_with(stub.sha256, len(data))
    path = pull_via(hub, manifest, tmp_path)
    assert path == tmp_path / FILENAME and path.read_bytes() == data
    assert [r.method for r in hub.requests] == ["HEAD", "GET"]
    assert hub.requests[1].path == f"/cdn/{stub.sha256}"  # followed the LFS-style redirect
    assert not leftovers(tmp_path)
    assert models.resolve("qwen2.5-0.5b-instruct", manifest, tmp_path) == path
    # Present and verified: no network at all.
    pull_via(hub, manifest, tmp_path)
    assert len(hub.requests) == 2


def test_pull_reads_env_for_manifest_models_dir_and_endpoint(
    hub: HubStub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = payload(4096)
    stub = hub.add_file(REPO, FILENAME, data)
    manifest_file = tmp_path / "manifest.json"
    manifest_file.write_text(manifest_with(stub.sha256).model_dump_json())
    monkeypatch.setenv("RUNNER_MANIFEST", str(manifest_file))
    monkeypatch.setenv("RUNNER_MODELS_DIR", str(tmp_path / "m"))
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)  # read at call time, not at import
    (tmp_path / "m").mkdir()
    assert models.pull("qwen2.5-0.5b-instruct", progress=False) == tmp_path / "m" / FILENAME


def test_unpinned_digest_is_recorded_then_enforced(hub: HubStub, tmp_path: Path) -> None:
    data = payload(8192)
    stub = hub.add_file(REPO, FILENAME, data)
    manifest = manifest_with(None)
    pull_via(hub, manifest, tmp_path)
    lock = json.loads((tmp_path / models.LOCK_FILENAME).read_text())
    record = lock["models"]["qwen2.5-0.5b-instruct"]
    assert (record["sha256"], record["size_bytes"]) == (stub.sha256, len(data))
    row = next(r for r in models.list_models(manifest, tmp_path) if r.name == QWEN)
    assert row.present and row.sha256 == stub.sha256 and not row.pinned
    # The hub now serves other bytes: the recorded digest catches it (trust on first use).
    (tmp_path / FILENAME).unlink()
    hub.add_file(REPO, FILENAME, payload(8192, seed=1))
    with pytest.raises(HashMismatch):
        pull_via(hub, manifest, tmp_path)


def test_dropped_connection_is_resumed_with_a_range_request(hub: HubStub, tmp_path: Path) -> None:
    """Behaviour chosen: huggingface-hub's own retry resumes the transfer; the pull succeeds."""
    data = payload(BIG)
    stub = hub.add_file(REPO, FILENAME, data)
    hub.faults.append("drop")
    path = pull_via(hub, manifest_with(stub.sha256), tmp_path)
    gets = hub.file_gets()
    assert len(gets) == 2 and gets[0].range is None
    assert gets[1].range is not None and gets[1].range.startswith("bytes=") and gets[1].range != "bytes=0-"
    assert models.sha256_file(path) == stub.sha256
    assert not leftovers(tmp_path)


def test_dead_download_fails_cleanly_and_leaves_no_partial_file(hub: HubStub, tmp_path: Path) -> None:
    data = payload(BIG)
    stub = hub.add_file(REPO, FILENAME, data)
    hub.faults.extend(["drop", "503"])  # cut mid-body, then the resume attempt is refused
    with pytest.raises(PullError, match=re.escape("could not download Qwen/Qwen2.5-0.5B-Instruct-GGUF")):
        pull_via(hub, manifest_with(stub.sha256), tmp_path)
    assert not (tmp_path / FILENAME).exists()
    assert not leftovers(tmp_path)
    with pytest.raises(ModelNotFound):
        models.resolve("qwen2.5-0.5b-instruct", manifest_with(stub.sha256), tmp_path)


def test_hash_mismatch_deletes_the_file_and_names_both_digests(hub: HubStub, tmp_path: Path) -> None:
    data = payload(64 * 1024)
    stub = hub.add_file(REPO, FILENAME, data)
    pinned = hashlib.sha256(b"what the manifest expects").hexdigest()
    with pytest.raises(HashMismatch) as caught:
        pull_via(hub, manifest_with(pinned), tmp_path)
    assert (caught.value.expected, caught.value.actual) == (pinned, stub.sha256)
    assert pinned in str(caught.value) and stub.sha256 in str(caught.value)
    assert not (tmp_path / FILENAME).exists()
    assert not leftovers(tmp_path)
    assert not (tmp_path / models.LOCK_FILENAME).exists()


@pytest.mark.llama
def test_a_pulled_model_is_served(hub: HubStub, tmp_path: Path) -> None:
    """The real SmolLM2 bytes, pulled through the stand-in hub, answer a chat completion."""
    real = models.resolve("smollm2-135m-instruct")
    stub = hub.add_file(REPO, FILENAME, path=real)
    manifest = manifest_with(stub.sha256, stub.size)
    path = pull_via(hub, manifest, tmp_path)
    assert os.path.getsize(path) == os.path.getsize(real)
    with LocalServer(path, model_name="pulled", n_ctx=512) as server:
        reply = httpx.post(
            f"{server.base_url}/chat/completions",
            json={"model": "pulled", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8},
            timeout=120,
        )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["object"] == "chat.completion"
    assert body["usage"]["prompt_tokens"] > 0 and body["usage"]["completion_tokens"] > 0


def test_resolve_choice_for_the_command_line(tmp_path: Path) -> None:
    assert models.resolve_choice(None, directory=tmp_path)[0] == "smollm2-135m-instruct"
    name, path = models.resolve_choice("smollm2-135m-instruct", directory=tmp_path)
    assert name == "smollm2-135m-instruct" and path.is_file()
    gguf = tmp_path / "custom.gguf"
    gguf.write_bytes(b"GGUF")
    assert models.resolve_choice(str(gguf)) == ("custom", gguf.resolve())
    with pytest.raises(ModelNotFound):
        models.resolve_choice("qwen2.5-0.5b-instruct", directory=tmp_path)


def test_a_start_of_several_model_names_is_named_as_such_on_the_command_line(tmp_path: Path) -> None:
    from tests.conftest import cli, one_error

    assert models.manifest_name("smollm2") == "smollm2-135m-instruct"
    assert models.manifest_name("gpt-4o") == "gpt-4o"  # no local model: a name for a base URL
    qwens = [m.name for m in models.load_manifest().models if m.name.startswith("qwen")]
    assert len(qwens) >= 2
    for args in (("run", "hi", "--model", "qwen"), ("serve", "--model", "qwen")):
        proc = cli(*args, runs_dir=tmp_path / "runs")
        said = one_error(proc.stderr)
        assert proc.returncode == 2 and said.startswith(f"error: 'qwen' is the start of {len(qwens)} local models ("), said
        assert all(name in said for name in qwens) and said.endswith("give more of the name"), said
    assert not (tmp_path / "runs").exists()


def test_unreachable_hub_is_one_clear_error(tmp_path: Path) -> None:
    from runner.local import free_port

    closed = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(PullError, match=f"from {closed}: .*(Connection refused|ConnectError)"):
        models.pull(QWEN, False, manifest=manifest_with(None), directory=tmp_path, endpoint=closed)
    assert not (tmp_path / FILENAME).exists() and not leftovers(tmp_path)


def test_a_local_run_takes_the_manifest_harness_defaults_unless_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runner import start
    from runner.request import RunRequest

    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")  # prepare() only records the file; nothing loads it
    entry = ModelEntry(name="tiny", source="hub", repo_id="x/tiny", filename=gguf.name, quantization="Q4_K_M",
                       first_turn_tool_choice="required", answer_after_tool_turns=3, answer_on_stall=True,
                       answer_restates_results="always", parallel_tool_calls=False)
    (tmp_path / "manifest.json").write_text(Manifest(default="tiny", fallback="tiny", models=[entry]).model_dump_json())
    monkeypatch.setenv("RUNNER_MANIFEST", str(tmp_path / "manifest.json"))
    monkeypatch.chdir(tmp_path)
    config = start.prepare(RunRequest(prompt="How many files?", model=str(gguf))).state.config
    assert (config.answer_after_tool_turns, config.answer_on_stall) == (3, True)
    assert (config.answer_restates_results, config.parallel_tool_calls) == ("always", False)
    assert config.endpoint.first_turn_tool_choice == "required"
    given = start.prepare(RunRequest(prompt="How many files?", model=str(gguf), answer_after=1)).state.config
    assert (given.answer_after_tool_turns, given.answer_on_stall) == (1, True)
    elsewhere = start.prepare(RunRequest(prompt="hi", model="m", base_url="http://127.0.0.1:9/v1")).state.config
    assert (elsewhere.answer_after_tool_turns, elsewhere.answer_on_stall, elsewhere.parallel_tool_calls) == (
        None, False, None)
