"""Settings for daily use: the config files, the environment, and where each value came from.

A setting is looked up, first hit wins, in: the command line; the environment
(`RUNNER_BASE_URL`, `OPENAI_BASE_URL`, `RUNNER_MODEL`, ...); `./runner.toml`; the user's
config file (`$XDG_CONFIG_HOME/runner/config.toml`, default `~/.config/runner/config.toml`;
`$RUNNER_CONFIG` names another); runner's default. Every value carries its source, which
`runner config show` prints.

API keys are never read from or written to a file: a config file names the environment
variable that holds the key (`api_key_env = "MY_PROVIDER_KEY"`), and a file holding a key
itself is refused. The key is found, first hit wins, in `--api-key`, `$RUNNER_API_KEY`, the
variable the config file names, `$OPENAI_API_KEY`. A run records at most the NAME of the
variable its key came from (`api_key_env`), so a resume or a worker finds it again; the key
itself stays in this process's memory (see `mask`, and `runner.client.ChatClient`, which
removes it from every error it raises).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.errors import UsageError

PROJECT_FILE = "runner.toml"
LOCAL_KEY = "sk-local"
"""What is sent as the key when none is configured (local servers ignore it)."""

KEY_ENVS = ("RUNNER_API_KEY", "OPENAI_API_KEY")
"""The conventional key variables: runner's own first, then the `openai` SDK's."""

SETTINGS: dict[str, tuple[type, tuple[str, ...], Any, str]] = {
    # name: (type, environment variables, default, what it is)
    "base_url": (str, ("RUNNER_BASE_URL", "OPENAI_BASE_URL"), None, "OpenAI-compatible endpoint, e.g. http://127.0.0.1:8080/v1"),
    "model": (str, ("RUNNER_MODEL",), None, "model name sent to base_url, or a local model (manifest name or .gguf)"),
    "api_key_env": (str, ("RUNNER_API_KEY_ENV",), None, "NAME of the environment variable holding the key"),
    "price_in_usd_per_mtok": (float, (), 2.0, "USD per million prompt tokens"),
    "price_out_usd_per_mtok": (float, (), 12.0, "USD per million completion tokens"),
    "max_turns": (int, (), 20, "turn cap of a new run (0: none)"),
    "max_budget_usd": (float, (), None, "budget of a new run, USD (0: none)"),
    "timeout_s": (float, (), 600.0, "per-request timeout, seconds"),
    "max_retries": (int, (), 4, "retries of 429/5xx/timeouts/refused connections"),
    "tool_choice": (str, (), None, "tool_choice of the first turn: auto, required, none"),
    "tools": (list, (), [], "tools offered besides the built-in ones: module:attribute or plugin names"),
    "workspace": (str, ("RUNNER_WORKSPACE",), None, "the folder a PROMPT's run works on (default: the current folder)"),
    "mcp": (dict, (), None, "MCP servers whose tools a new run offers: [mcp.servers.NAME] tables (docs/mcp.md)"),
}
"""Every setting a config file may hold, in the order `runner config show` prints them; each
applies to `runner run` (the runs directory is `--runs-dir` or `$RUNNER_RUNS_DIR`)."""

MINIMUMS: dict[str, float] = {
    "price_in_usd_per_mtok": 0.0, "price_out_usd_per_mtok": 0.0, "max_turns": 0, "max_budget_usd": 0.0,
    "timeout_s": 0.001, "max_retries": 0,
}
"""The least value of each numeric setting, the bounds `runner run`'s options have (`--price-in`,
`--max-turns`, ...): a config file or the environment is checked against them too."""

_KIND_WORDS: dict[type, str] = {str: "a string", int: "a whole number", float: "a number", list: "a list",
                                dict: "a table"}

_KEYISH = re.compile(r"(^|_)(api_?key|key|token|secret|password)$", re.IGNORECASE)


@dataclass(frozen=True)
class Value:
    """One effective setting: its value and where it came from ("--api-key", "env RUNNER_MODEL",
    "./runner.toml", "default", ...)."""

    value: Any
    source: str


@dataclass(frozen=True)
class Key:
    """The API key in force: the key itself (never printed: see `mask`), where it came from,
    and the NAME of the environment variable it was read from (None for `--api-key` or none)."""

    value: str | None
    source: str
    env: str | None

    def masked(self) -> str:
        return mask(self.value) if self.value else "(none: sends sk-local)"


def mask(key: str) -> str:
    """A key as it may be shown: its first 3 and last 4 characters and its length."""
    if len(key) < 12:
        return f"**** ({len(key)} chars)"
    return f"{key[:3]}…{key[-4:]} ({len(key)} chars)"


def user_config_path() -> Path:
    """`$RUNNER_CONFIG`, else `$XDG_CONFIG_HOME/runner/config.toml` (default `~/.config`)."""
    named = os.environ.get("RUNNER_CONFIG")
    if named:
        return Path(named)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "runner" / "config.toml"


def config_files() -> list[Path]:
    """The config files read, first wins: `./runner.toml`, then the user's (those that exist)."""
    return [p for p in (Path(PROJECT_FILE), user_config_path()) if p.is_file()]


def read_file(path: Path) -> dict[str, Any]:
    """One config file's settings, checked.

    Raises:
        UsageError: unreadable TOML, an unknown setting, a value of the wrong type or below its
            least (`MINIMUMS`), or a key written in the file (name its environment variable
            with `api_key_env` instead).
    """
    import tomllib  # here: a command with no config file to read need not load it

    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read config file {path}: {exc}") from None
    for name, value in data.items():
        if name not in SETTINGS and _KEYISH.search(name) and _secret_like(value):
            raise UsageError(f"config file {path} holds a secret ({name!r}); keep keys out of files: "
                             f'put it in an environment variable and write api_key_env = "THAT_VARIABLE"')
        if name not in SETTINGS:
            import difflib

            near = difflib.get_close_matches(name, SETTINGS, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise UsageError(f"config file {path}: unknown setting {name!r}{hint} (known: {', '.join(SETTINGS)})")
        kind = SETTINGS[name][0]
        ok = isinstance(value, kind) or (kind is float and isinstance(value, int) and not isinstance(value, bool))
        if not ok or (kind is int and isinstance(value, bool)):
            raise UsageError(f"config file {path}: {name} must be {_KIND_WORDS[kind]}, got {value!r}")
        if name in MINIMUMS and value < MINIMUMS[name]:
            raise UsageError(f"config file {path}: {name} must be at least {MINIMUMS[name]:g}, got {value!r}")
    return data


class Settings:
    """The effective settings of one command: `get(name, flag)` answers with the command
    line's value when given, else the environment, the config files, the default.

    Args:
        flags: what the command line gave, by setting name (None: not given).
    """

    def __init__(self, flags: dict[str, Any] | None = None) -> None:
        self.flags = {k: v for k, v in (flags or {}).items() if v is not None}
        self.files = [(path, read_file(path)) for path in config_files()]

    def value(self, name: str) -> Value:
        """The effective value of `name` and its source."""
        kind, envs, default, _ = SETTINGS[name]
        if name in self.flags:
            return Value(self.flags[name], "--" + name.replace("_", "-"))
        for env in envs:
            raw = os.environ.get(env)
            if raw:
                return Value(_parse(name, kind, raw, env), f"env {env}")
        for path, data in self.files:
            if name in data:
                return Value(float(data[name]) if kind is float else data[name], str(path))
        return Value(default, "default")

    def get(self, name: str) -> Any:
        return self.value(name).value

    def key(self, flag_key: str | None = None) -> Key:
        """The API key in force (see the module docstring for the order).

        Raises:
            UsageError: the variable a config file or `--api-key-env` names is not set.
        """
        if flag_key:
            return Key(flag_key, "--api-key", None)
        named = self.value("api_key_env")
        order = [KEY_ENVS[0], *([named.value] if named.value else []), KEY_ENVS[1]]
        for env in order:
            if key := os.environ.get(env):
                return Key(key, f"env {env}", env)
        if named.value:
            raise UsageError(f"the API key variable {named.value} (api_key_env, from {named.source}) is not set")
        return Key(None, "none", None)

    def rows(self, flag_key: str | None = None) -> list[tuple[str, str, str]]:
        """(setting, value, source) for every setting, the key masked: what `config show` prints."""
        rows = []
        for name in SETTINGS:
            v = self.value(name)
            rows.append((name, "" if v.value is None else _show(v.value), v.source))
        try:
            key = self.key(flag_key)
            rows.append(("api key", key.masked(), key.source))
        except UsageError as exc:
            rows.append(("api key", "(missing)", str(exc)))
        return rows


def key_for(api_key_env: str | None, flag_key: str | None = None, *, given: bool = False) -> str | None:
    """The key a run sends: `flag_key`, else the variable the run recorded, else (a run that
    recorded none and was not `given` its key on the command line) the conventional ones
    (`KEY_ENVS`), else `LOCAL_KEY`. None when the run's own key is not at hand (its variable
    is not set here, or it was given one on the command line and none is given now): a key
    meant for one provider is never sent to another in its place (the run then stops
    resumable, asking nothing)."""
    if flag_key:
        return flag_key
    if api_key_env:
        return os.environ.get(api_key_env) or None
    if given:
        return None
    for env in KEY_ENVS:
        if key := os.environ.get(env):
            return key
    return LOCAL_KEY


def _secret_like(value: Any) -> bool:
    """True for a value that may be a key itself: text that is not the NAME of an environment
    variable (such as MY_PROVIDER_KEY) and not a word of setting (a number, a list, true)."""
    return isinstance(value, str) and re.fullmatch(r"[A-Z_][A-Z0-9_]*", value) is None and len(value) >= 8


def _parse(name: str, kind: type, raw: str, env: str) -> Any:
    if kind is list:
        return [part for part in raw.split(",") if part]
    try:
        value = kind(raw)
    except ValueError:
        raise UsageError(f"${env} must be {_KIND_WORDS[kind]}, got {raw!r}") from None
    if name in MINIMUMS and value < MINIMUMS[name]:
        raise UsageError(f"${env} must be at least {MINIMUMS[name]:g}, got {raw!r}")
    return value


def _show(value: Any) -> str:
    if isinstance(value, dict):  # the mcp table: its servers by name (their env and headers may hold secrets)
        return ", ".join(map(str, value.get("servers", {}))) or "(none)"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "(none)"
    return str(value)
