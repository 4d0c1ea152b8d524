"""What every ``mq`` command shares: the parser class, argument types, opening the store, the
output (rich tables or one JSON document) and progress on stderr."""

from __future__ import annotations

import argparse
import base64
import dataclasses
import enum
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

from rich.console import Console, RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from engine.config import load_config
from engine.errors import CliError, InvalidArgumentError
from engine.protocol.times import parse_time
from engine.store.store import Store

PROG = "mq"
EXIT_OK = 0
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130
JAVA_MESSAGE = "lakemq needs Java 17: install it (e.g. apt-get install -y openjdk-17-jre-headless)"
MIN_JAVA = 17


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting, so errors are one line."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see '{self.prog} --help')")


class Output:
    """Where a command's answer goes: rich renderables on stdout, or, with ``--json``, exactly one
    JSON document. Progress and notes go to stderr either way."""

    def __init__(self, out: Console, err: Console, *, as_json: bool) -> None:
        self.out = out
        self.err = err
        self.as_json = as_json

    def emit(self, data: Any, *renderables: RenderableType | str) -> None:
        """The command's result: ``data`` as JSON with ``--json``, else ``renderables``."""
        if self.as_json:
            self.out.file.write(json.dumps(jsonable(data), ensure_ascii=False) + "\n")
            self.out.file.flush()
            return
        for item in renderables:
            self.out.print(item, soft_wrap=isinstance(item, str))  # a line of text is never cut

    def note(self, text: str) -> None:
        """A line for a person (stderr with ``--json``, so stdout stays one document)."""
        (self.err if self.as_json else self.out).print(text, markup=False, highlight=False, soft_wrap=True)

    def warn(self, text: str) -> None:
        """One line on stderr that qualifies the answer (it stays off stdout, whatever the format)."""
        self.err.print(text, markup=False, highlight=False, soft_wrap=True)

    @contextmanager
    def progress(self, message: str) -> Iterator[None]:
        """A spinner on stderr while something slow runs (nothing when stderr is not a terminal)."""
        if self.err.is_terminal:
            with self.err.status(message, spinner="dots"):
                yield
        else:
            yield

    def bar(self) -> Progress:
        """Progress bars on stderr (``add_task``, ``advance``); disabled when stderr is not a terminal."""
        return Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.err,
            disable=not self.err.is_terminal,
            transient=True,
        )


def body_json(body: bytes) -> Any:
    """A body as JSON: its text when it is UTF-8, else ``{"base64": ...}``."""
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(body).decode("ascii")}


def jsonable(value: Any) -> Any:
    """Dataclasses, enums, bytes, mappings and sequences as plain JSON values."""
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, bytes | bytearray):
        return body_json(bytes(value))
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


# ----------------------------------------------------------------------------- argument types
def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an int >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be >= {minimum}")
        return value

    parse.__name__ = "int"
    return parse


def time_arg(text: str) -> int:
    """argparse type for :func:`engine.protocol.times.parse_time`."""
    try:
        return parse_time(text)
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


time_arg.__name__ = "time"


def parse_properties(items: Sequence[str] | None) -> dict[str, str]:
    """``key=value`` items as a dict.

    Raises:
        InvalidArgumentError: an item without ``=`` or with an empty key.
    """
    props: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidArgumentError(f"--property {item!r} must look like key=value", property=item)
        props[key] = value
    return props


def open_store(args: argparse.Namespace) -> Store:
    """The store named by ``--store`` (else ``MQ_STORE``, ``conf/engine.toml``, ``./mqdata``)."""
    return Store.open(config=load_config(store=args.store))


def one_line(error: BaseException) -> str:
    """An error's message on one line."""
    text = " ".join(str(error).split())
    return text or type(error).__name__


# ----------------------------------------------------------------------------- Java
def _java_major() -> int | None:
    """Major version of the Java runtime Spark would use (JAVA_HOME, else PATH), or None."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else None
    if java is None or not os.path.exists(java):
        java = shutil.which("java")
    if java is None:
        return None
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
    if match is None:
        return None
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8.0_292" is Java 8
        major = int(match.group(2))
    return major


def require_java() -> None:
    """Raises :class:`CliError` unless a Java 17+ runtime is available for Spark."""
    major = _java_major()
    if major is None or major < MIN_JAVA:
        raise CliError(JAVA_MESSAGE, java_version=major)


def console(stderr: bool) -> Console:
    """A rich console on stdout or stderr; 160 columns when piped (tables would be cut at 80)."""
    stream = sys.stderr if stderr else sys.stdout
    wide = None if stream.isatty() or "COLUMNS" in os.environ else 160
    return Console(file=stream, width=wide, stderr=stderr)
