"""Sybil parsers for the docs' non-Python blocks: shell transcripts run, config files parsed.

- ``console``, ``sh``, ``bash`` and ``shell`` blocks run in ``bash``, in the page's directory
  and environment, in order with the page's Python samples. A block with ``$ `` lines is a
  transcript: each ``$`` line (with its ``\\``-continued lines) is a command, the lines up to the
  next ``$`` its shown output, compared with the real output (stdout and stderr, each line's
  trailing blanks dropped; ``...`` in the shown output stands for any text, a line break
  included: ids, timings, paths; a timestamp shown, ``2026-11-30 20:58:03``, stands for any
  timestamp of that shape, so tables keep their columns). A command must exit 0, unless the
  next command is ``echo $?``, which shows its status. A block without ``$`` lines is a
  script: each line a command, its output not shown, its status 0. The commands of one block
  share one shell; what a block exports, the page's later blocks and Python samples see, as in
  the reader's terminal (a ``cd`` lasts for its block).
- A block that cannot run in a test (it installs packages, needs Docker or systemd, or starts a
  server that runs until stopped) follows ``<!-- console: not-run (why) -->``; the reason is
  required.
- ``yaml`` blocks load with ``yaml.safe_load``; ``toml`` with ``tomllib``; ``dockerfile`` blocks
  pass :func:`check_dockerfile`; ``ini`` blocks pass :func:`check_ini` (a systemd unit when it
  has a ``[Service]`` section).
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import subprocess
import tempfile
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml
from sybil import Document, Example, Region
from sybil.parsers.myst import CodeBlockParser

SHELLS = ("console", "sh", "bash", "shell")
NOT_RUN = re.compile(r"<!--\s*console:\s*not-run\s*\(([^)]+)\)\s*-->\s*$")
_MARK = "\x1e"
_SHELL_OWN = frozenset({"_", "SHLVL", "PWD", "OLDPWD"})  # bash's own, not the page's
_MARKED = re.compile(_MARK + r"(\d+)\n")

# Dockerfile instructions (https://docs.docker.com/reference/dockerfile/).
DOCKER_INSTRUCTIONS = frozenset(
    {"ADD", "ARG", "CMD", "COPY", "ENTRYPOINT", "ENV", "EXPOSE", "FROM", "HEALTHCHECK", "LABEL"}
    | {"MAINTAINER", "ONBUILD", "RUN", "SHELL", "STOPSIGNAL", "USER", "VOLUME", "WORKDIR"}
)
_EXEC_FORM = frozenset({"CMD", "ENTRYPOINT", "RUN", "SHELL", "HEALTHCHECK"})
SYSTEMD_SECTIONS = frozenset({"Unit", "Service", "Install", "Timer", "Socket", "Path", "Mount"})


@dataclass(frozen=True, kw_only=True)
class Command:
    """One command of a shell block, and the output a transcript shows for it (``None``: a
    script's line, whose output is not shown)."""

    line: int
    text: str
    shown: str | None


def commands(block: str) -> list[Command]:
    """The commands of a shell block: a transcript's ``$`` lines, or a script's lines."""
    lines = block.splitlines()
    transcript = any(line.startswith("$ ") for line in lines)
    found: list[Command] = []
    command: list[str] = []
    shown: list[str] = []
    start = 0

    def close() -> None:
        if command:
            text = "\n".join(command)
            found.append(
                Command(line=start, text=text, shown="\n".join(shown) if transcript else None)
            )

    for number, line in enumerate(lines, 1):
        if command and command[-1].endswith("\\"):
            command.append(line)
        elif transcript and line.startswith("$ "):
            close()
            command, shown, start = [line[2:]], [], number
        elif transcript:
            if not command:
                raise ValueError(f"line {number}: output before the first `$ ` command: {line!r}")
            shown.append(line)
        elif line.strip() and not line.lstrip().startswith("#"):
            close()
            command, shown, start = [line], [], number
    close()
    return found


_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?")


def matches(shown: str, real: str) -> bool:
    """Whether ``real`` output is what ``shown`` shows: ``...`` stands for any text, and a
    timestamp shown (``2026-11-30 20:58:03``) for any timestamp of that shape."""
    pattern = ".*?".join(_literal(part) for part in _tidy(shown).split("..."))
    return re.fullmatch(pattern, _tidy(real), re.DOTALL) is not None


def _literal(shown: str) -> str:
    return _TIMESTAMP.pattern.join(re.escape(part) for part in _TIMESTAMP.split(shown))


def _tidy(output: str) -> str:
    return "\n".join(line.rstrip() for line in output.strip("\n").splitlines()).strip("\n")


def run_shell_block(block: str) -> None:
    """Runs a shell block's commands in one ``bash``, in this process's directory and
    environment, and raises ``AssertionError`` on a status or an output that differs."""
    found = commands(block)
    script = ["exec 2>&1"]
    for command in found:
        # `echo $?` after a command still sees that command's status.
        script += [command.text, f'__rc=$?; printf "{_MARK}%d\\n" "$__rc"; (exit "$__rc")']
    with tempfile.TemporaryDirectory() as scratch:
        exported = Path(scratch) / "environment"
        script.append(f"env -0 > {shlex.quote(str(exported))}")
        ran = subprocess.run(
            ["bash", "--noprofile", "--norc", "-c", "\n".join(script)],
            capture_output=True,
            text=True,
            timeout=120,
            env=dict(os.environ),
            check=False,
        )
        if exported.exists():
            _adopt(exported.read_bytes())
    parts = _MARKED.split(ran.stdout)
    outputs, statuses = parts[0:-1:2], [int(status) for status in parts[1::2]]
    if len(statuses) != len(found):
        raise AssertionError(f"the shell stopped after {len(statuses)} command(s):\n{ran.stdout}")
    for index, (command, output, status) in enumerate(zip(found, outputs, statuses, strict=True)):
        shown_status = index + 1 < len(found) and found[index + 1].text.strip() == "echo $?"
        if status != 0 and not shown_status:
            raise AssertionError(
                f"line {command.line}: `{command.text}` exited {status}:\n{output}"
            )
        if command.shown is not None and not matches(command.shown, output):
            raise AssertionError(
                f"line {command.line}: `{command.text}` printed\n{output}\n"
                f"but the page shows\n{command.shown}"
            )


def _adopt(environment: bytes) -> None:
    """Makes the shell's environment this process's: what a block exported, later blocks and
    the page's Python samples see, as in the reader's terminal."""
    found = dict(entry.split("=", 1) for entry in environment.decode().split("\0") if "=" in entry)
    for name in _SHELL_OWN:
        found.pop(name, None)
    for name in set(os.environ) - set(found) - _SHELL_OWN:
        del os.environ[name]
    os.environ.update(found)


def check_dockerfile(text: str) -> None:
    """Raises ``ValueError`` unless ``text`` reads as a Dockerfile: known instructions, each
    with arguments, ``\\`` continuations joined, ``FROM`` first (``ARG`` may precede it), and
    exec forms (``CMD ["a", "b"]``) that are JSON arrays of strings."""
    instructions: list[tuple[int, str, str]] = []
    pending = ""
    start = 0
    for number, line in enumerate(text.splitlines(), 1):
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if not pending:
            start = number
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        name, _, arguments = pending.strip().partition(" ")
        instructions.append((start, name, arguments.strip()))
        pending = ""
    if pending:
        raise ValueError(f"line {start}: a continuation runs past the end")
    if not instructions:
        raise ValueError("no instruction")
    for number, name, arguments in instructions:
        if name.upper() not in DOCKER_INSTRUCTIONS:
            raise ValueError(f"line {number}: unknown instruction {name!r}")
        if not arguments:
            raise ValueError(f"line {number}: {name} without arguments")
        if name.upper() in _EXEC_FORM and arguments.startswith("["):
            form = json.loads(arguments)
            if not (isinstance(form, list) and all(isinstance(item, str) for item in form)):
                raise ValueError(f"line {number}: {name}'s exec form is not a list of strings")
    first = next(name for _, name, _ in instructions if name.upper() != "ARG")
    if first.upper() != "FROM":
        raise ValueError(f"the first instruction is {first}, not FROM")


def check_ini(text: str) -> None:
    """Parses ``text`` as systemd does an ini file (repeated keys allowed, ``%`` specifiers
    left alone); a unit with a ``[Service]`` must have a ``[Unit]`` and an ``ExecStart=``."""
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string(text)
    sections = set(parser.sections())
    if not sections:
        raise ValueError("no section")
    if "Service" in sections:
        if unknown := sections - SYSTEMD_SECTIONS:
            raise ValueError(f"not systemd unit sections: {sorted(unknown)}")
        if "Unit" not in sections:
            raise ValueError("a service unit without [Unit]")
        if "ExecStart" not in parser["Service"]:
            raise ValueError("[Service] without ExecStart=")


def _checker(check: Callable[[str], object]) -> Callable[[Example], None]:
    def evaluate(example: Example) -> None:
        check(str(example.parsed))

    return evaluate


def run_shell_example(example: Example) -> None:
    """Sybil's evaluator for a shell block."""
    run_shell_block(str(example.parsed))


CHECKS: dict[str, Callable[[str], object]] = {
    "yaml": yaml.safe_load,
    "toml": tomllib.loads,
    "dockerfile": check_dockerfile,
    "ini": check_ini,
}


class OtherBlocks:
    """Sybil regions for a page's shell, YAML, TOML, Dockerfile and ini blocks, but those
    that follow ``<!-- console: not-run (why) -->``."""

    def __init__(self) -> None:
        self.parsers = [CodeBlockParser(language, run_shell_example) for language in SHELLS] + [
            CodeBlockParser(language, _checker(check)) for language, check in CHECKS.items()
        ]

    def __call__(self, document: Document) -> Iterator[Region]:
        for parser in self.parsers:
            for region in parser(document):
                if NOT_RUN.search(document.text, 0, region.start) is None:
                    yield region
