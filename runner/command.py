"""How the `runner` process parses its command line cheaply: the click command and group
classes the CLI uses, and what `runner.cli.main` sets up around parsing.

typer (0.29 here) coerces every option's value through a pydantic `TypeAdapter` it builds on
first use, even for a value that is absent or already of the option's type; `runner run` has
~35 options, and a cold `runner run --scenario plan` built them all. `Command` gives each of
its parameters a `Coercion` that returns such values as they are (exactly what the adapter
returns for them) and hands every other value to typer's own coercion, built only then. typer
also builds every command's options before it dispatches to one: while a command line runs,
the app holds only the command it names (`building_only_the_command_in`). A typer without
these internals (`_runtime_param`) keeps its own way.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer
import typer.main

PLUGIN_LOADER = "pydantic.plugin._loader"
PLUGINS_OFF = ("__all__", "1", "true")
"""The values of PYDANTIC_DISABLE_PLUGINS under which pydantic loads no plugin at all."""


def prepare_process() -> None:
    """What `runner.cli.main` sets before parsing: work this process never needs, skipped.

    - `import httpx` also imports httpx's own command line (click, rich, pygments: ~90 ms)
      when they are installed, and skips it when it cannot be imported; runner never runs it.
    - pydantic looks for plugins (entry points of group "pydantic") by reading the metadata of
      every installed distribution when the first model is validated; runner's models are its
      own, so plugins are off unless `PYDANTIC_DISABLE_PLUGINS=` (empty) turns them back on.
      Even off, importing pydantic's plugin loader imports `importlib.metadata` (~12 ms); a
      stand-in answers "no plugins" while they are off, and loads the real loader otherwise.
    """
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    if os.environ["PYDANTIC_DISABLE_PLUGINS"] in PLUGINS_OFF and PLUGIN_LOADER not in sys.modules:
        stand_in = types.ModuleType(PLUGIN_LOADER, "No pydantic plugins while PYDANTIC_DISABLE_PLUGINS turns them off.")
        stand_in.get_plugins = _no_plugins  # type: ignore[attr-defined]
        sys.modules[PLUGIN_LOADER] = stand_in


def _no_plugins() -> Any:
    """pydantic's `get_plugins` while plugins are off; the real one once they are turned on."""
    if os.environ.get("PYDANTIC_DISABLE_PLUGINS") in PLUGINS_OFF:
        return ()
    sys.modules.pop(PLUGIN_LOADER, None)
    return importlib.import_module(PLUGIN_LOADER).get_plugins()


_WHOLE = re.compile(r"\s*[+-]?[0-9]+\s*")


class Coercion:
    """One parameter's coercion (typer's `RuntimeParam` protocol): absent values, and values
    already of the parameter's type and within its bounds, pass as typer's adapter would pass
    them; a path given as text becomes a `Path` before typer's own path checks; anything else
    goes to typer's coercion, built on first need. A path's `~` is expanded (the shell leaves
    it in `--opt=~/x`), and an empty path is refused. A whole number must be written as one:
    typer's adapter would take "3.0" (pydantic's lax mode), which a config file refuses."""

    def __init__(self, param: Any) -> None:
        self.descriptor = param.type_descriptor
        self.info = self.descriptor.parameter_info
        self._typer: Any = None

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        many = param.multiple or param.nargs == -1
        kind = self._kind()
        if value is None:
            return () if many else None
        if many and kind is str and isinstance(value, (list, tuple)) and all(type(v) is str for v in value):
            return list(value)
        if not many and kind in (str, int, float) and type(value) is kind and self._within(value):
            return value
        if not many and kind is int and type(value) is str and not _WHOLE.fullmatch(value):
            raise typer.BadParameter(f"{value!r} is not a whole number", ctx=ctx, param=param)
        if not many and kind is float and type(value) is str:
            try:
                float(value)
            except ValueError:
                raise typer.BadParameter(f"{value!r} is not a number", ctx=ctx, param=param) from None
        if not many and kind in (int, float) and type(value) in (str, int, float):
            self._check_range(kind, value, param, ctx)
        if not many and kind is Path and type(value) is str:
            from typer._param_types import coerce_cli_path

            if not value.strip():  # an unset shell variable: not the current folder
                raise typer.BadParameter("an empty path names no file or folder", ctx=ctx, param=param)
            try:
                path = Path(value).expanduser()  # `--opt=~/x` reaches here unexpanded by the shell
            except RuntimeError:  # ~name of no user, or no home folder
                raise typer.BadParameter(f"cannot tell whose home folder {value.split('/')[0]} is",
                                         ctx=ctx, param=param) from None
            return coerce_cli_path(path, self.info, path_type=Path, param=param, ctx=ctx)
        if self._typer is None:
            from typer._coercion import build_runtime_param

            self._typer = build_runtime_param(self.descriptor)
        return self._typer.coerce(value, param, ctx)

    def _kind(self) -> Any:
        """The type of the parameter's values (of each item, for a list); None when a parser,
        a choice, a file type or a path type of its own decides."""
        described = self.descriptor
        if self.info.parser is not None or described.is_choice or described.is_file or self.info.path_type:
            return None
        if described.is_list:
            items = typing.get_args(described.annotation)
            return items[0] if len(items) == 1 else None
        return None if described.is_tuple else described.annotation

    def _check_range(self, kind: type, value: str | float, param: Any, ctx: Any) -> None:
        """A number out of the parameter's bounds is refused in click's words ("0 is not in the
        range x>=1"), not pydantic's ("Input should be greater than or equal to 1")."""
        if kind is int and isinstance(value, float) and not value.is_integer():
            return  # not a whole number: typer's coercion says so
        try:
            number = kind(value)
        except ValueError:
            return  # typer's coercion says what is wrong with it
        if not self._within(number):
            low, high = self.info.min, self.info.max
            shown = f"{low}<=x<={high}" if low is not None and high is not None else (
                f"x>={low}" if low is not None else f"x<={high}")
            raise typer.BadParameter(f"{str(value).strip()} is not in the range {shown}.", ctx=ctx, param=param)

    def _within(self, value: Any) -> bool:
        """A number within the parameter's `min` and `max` (text has no bounds)."""
        low, high = self.info.min, self.info.max
        return isinstance(value, str) or ((low is None or value >= low) and (high is None or value <= high))


def _coerce_cheaply(params: list[Any]) -> None:
    """Give each typer parameter that has no coercion yet a `Coercion` (typer builds its own
    when `_runtime_param` is None; a typer without that attribute keeps its own way)."""
    for param in params:
        if getattr(param, "_runtime_param", False) is None and hasattr(param, "type_descriptor"):
            param._runtime_param = Coercion(param)


class Command(typer.core.TyperCommand):
    """A command whose parameters coerce through `Coercion`, and whose help names each
    argument by its metavar alone, not its Python type."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        _coerce_cheaply(self.get_params(ctx))
        return super().parse_args(ctx, args)

    def format_options(self, ctx: Any, formatter: Any) -> None:
        for param in (p for p in self.get_params(ctx) if p.param_type_name == "argument"):
            param.display_type_rich = lambda ctx: None  # type: ignore[attr-defined]
        super().format_options(ctx, formatter)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        """The usage line names a required argument as `RUN_ID`, an optional one as
        `[PROMPT]` (typer 0.29 writes a required one as `{RUN_ID}`)."""
        for param in (p for p in self.get_params(ctx) if p.param_type_name == "argument"):
            if hasattr(param, "_usage_display_name"):
                param._usage_display_name = lambda param=param: _usage_name(param)
        return list(super().collect_usage_pieces(ctx))


def _usage_name(param: Any) -> str:
    name = param.metavar or param.name.upper()
    return (name if param.required else f"[{name}]") + ("..." if param.nargs != 1 else "")


class Group(typer.core.TyperGroup):
    """A command group whose own parameters (--debug, --version, shell completion) coerce
    through `Coercion`, and whose help lists each command with what it does in words that fit
    the line (`short_help`), where click would cut its first sentence off with "..."."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        _coerce_cheaply(self.get_params(ctx))
        return super().parse_args(ctx, args)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        commands = [(name, self.get_command(ctx, name)) for name in self.list_commands(ctx)]
        shown = [(name, cmd) for name, cmd in commands if cmd is not None and not cmd.hidden]
        if not shown:
            return
        limit = formatter.width - 6 - max(len(name) for name, _ in shown)
        with formatter.section("Commands"):
            formatter.write_dl([(name, short_help(cmd.short_help or cmd.help or "", limit)) for name, cmd in shown])


def short_help(text: str, limit: int) -> str:
    """A command's help in at most `limit` characters: its first sentence, else the part of
    it before a colon or a parenthesis, else its first words."""
    sentence = " ".join(text.split("\n\n")[0].split())
    sentence = re.split(r"(?<=[.!?])\s", sentence)[0]
    if len(sentence) <= limit:
        return sentence
    head = re.split(r":\s| \(", sentence)[0].rstrip(".,;")
    if len(head) <= limit:
        return head + "."
    return sentence[:limit - 3].rsplit(" ", 1)[0] + "..."


@contextlib.contextmanager
def building_only_the_command_in(app: typer.Typer, args: list[str]) -> Iterator[None]:
    """While the command line runs, `app` holds only the command `args` name first (when they
    name one of its commands): typer builds the options of every command it holds before it
    dispatches to one, ~4 ms for runner's twenty. `runner --help`, a group, a mistyped name and
    shell completion see every command."""
    asked = args[0] if args and not args[0].startswith("-") else None
    def name(c: Any) -> str:
        return c.name or typer.main.get_command_name(getattr(c.callback, "__name__", ""))

    kept = [c for c in app.registered_commands if asked is not None and name(c) == asked]
    completing = any(k.startswith("_") and k.endswith("_COMPLETE") for k in os.environ)
    if len(kept) != 1 or completing:
        yield
        return
    commands, groups = app.registered_commands, app.registered_groups
    app.registered_commands, app.registered_groups = kept, []
    try:
        yield
    finally:
        app.registered_commands, app.registered_groups = commands, groups
