"""The ``ettools`` click group :func:`main` (the subcommands are added by :mod:`ettools.cli`)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import click

from ettools import __version__
from ettools.cli_options import quiet_option
from ettools.io import clean_message


class LazyCommands(MutableMapping[str, click.Command]):
    """A group's subcommands by name, each imported when first looked up.

    Each subcommand's module pulls in its own stage (replay, search, scale, …), and a run of one
    command should pay only for that one (issue 27: ``ettools info`` imported every command's
    modules, a third of its start-up). The names are known without importing anything (listing,
    ``in``, iteration); a value is the command itself, imported by its loader on first access (so
    ``commands.items()`` imports them all, as ``ettools --help`` must)."""

    def __init__(self, commands: MutableMapping[str, click.Command] | None = None) -> None:
        self._loaded: dict[str, click.Command] = dict(commands or {})
        self._loaders: dict[str, Callable[[], click.Command]] = {}

    def add_lazy(self, name: str, loader: Callable[[], click.Command]) -> None:
        """Register command ``name``, imported by ``loader()`` when first looked up."""
        self._loaders[name] = loader

    def __getitem__(self, name: str) -> click.Command:
        cmd = self._loaded.get(name)
        if cmd is None:
            if name not in self._loaders:
                raise KeyError(name)  # no such command (``get`` answers None)
            cmd = self._loaded[name] = self._loaders[name]()
        return cmd

    def __setitem__(self, name: str, cmd: click.Command) -> None:
        self._loaded[name] = cmd

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        self._loaded.pop(name, None)
        self._loaders.pop(name, None)

    def __contains__(self, name: object) -> bool:  # without importing it
        return name in self._loaded or name in self._loaders

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*self._loaders, *self._loaded]))

    def __len__(self) -> int:
        return len(self._loaders.keys() | self._loaded.keys())


class _Group(click.Group):
    """The ettools group: usage errors too are one line on stderr (exit 2), like bad input.
    Its subcommands are a :class:`LazyCommands`: each is imported when it is run or listed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands: LazyCommands = LazyCommands(self.commands)

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except getattr(click.exceptions, "NoArgsIsHelpError", ()) as e:
            # `ettools` alone asks for the help: printed as help (it came out as one line of "\n")
            click.echo(e.format_message())
            sys.exit(0)
        except click.ClickException as e:
            where = f" ({e.ctx.command_path} --help)" if isinstance(e, click.UsageError) and e.ctx else ""
            click.echo(f"ettools: error: {clean_message(e.format_message())}{where}", err=True)
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("ettools: error: interrupted", err=True)
            sys.exit(130)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ettools")
@quiet_option
def main() -> None:
    """Convert, synthesize, rewrite, validate and replay execution traces of distributed AI jobs."""
    _log_warnings_as_lines()


class _LevelPrefix(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        kind = "warning: " if record.levelno >= logging.WARNING else ""
        return f"ettools: {kind}{clean_message(record.getMessage())}"


def _log_warnings_as_lines() -> None:
    """The library's log warnings (ASTRA-sim notes of the Chakra writer, skipped notes of readers)
    as ``ettools: warning: …`` lines on stderr, like every other warning the commands print (they
    came out bare, through logging's last-resort handler)."""
    log = logging.getLogger("ettools")
    if not any(isinstance(h, _EchoHandler) for h in log.handlers):
        h = _EchoHandler(logging.WARNING)
        h.setFormatter(_LevelPrefix())
        log.addHandler(h)  # propagation stays: an application's own root handlers see them too


class _EchoHandler(logging.Handler):
    """A record as one line on the current stderr (resolved at each record, as click.echo does)."""

    def emit(self, record: logging.LogRecord) -> None:
        click.echo(self.format(record), err=True)
