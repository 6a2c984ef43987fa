"""``python -m bench compare A [B]``: two revisions' hot path, interleaved on one machine.

The regression guard for the claim, completion and enqueue paths (issue 46)::

    python -m bench compare main                  # the working tree against main
    python -m bench compare HEAD~1 HEAD --rounds 3 --backends postgresql
    python -m bench compare main --quick --rounds 2 --backends sqlite   # a smoke run
    nox -s bench_compare -- main

A and B are git revisions; B defaults to the **working tree** (HEAD plus its uncommitted and
untracked changes to the files the wheel is built from), since the common question is "what
does my change do to main". Each is installed, non-editable, in a virtualenv of its own,
cached by commit (bench/compare_envs.py), and both run the **same harness**: this checkout's
``bench/``, copied where no ``sqlqueue`` package can shadow the installed one.

Each round runs ``python -m bench --only enqueue,bulk,drain --runs 1 --json`` once with A's
interpreter and once with B's, back to back on the same database servers, alternating which
goes first (A B, B A, A B, …) so neither always gets the warmer machine. Every figure's B/A
ratio is taken per round and summarised as median (min-max); a figure is flagged when every
round's ratio lies more than 5 % (``--threshold``) from 1 on the same side
(bench/compare_figures.py). The raw-SQL ceiling is measured in each run too: it is the
harness's code on both sides, so its B/A shows how far the machine alone moved.

Prints one table with the load average at the start and the end, writes it as markdown with
every round's raw runs as JSON (``--output``, default
``bench/results/compare-<A>-<B>.md`` and ``.json``), and exits 3 when a figure got worse
beyond the threshold (0 otherwise). Needs only git and the standard library here: the
sqlqueue under test is imported by the sides, never by this process.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from bench import compare_envs, compare_figures, report
from bench.compare_envs import Revision, Side
from bench.compare_figures import Figure

__all__ = ["main"]

#: The repository whose revisions are compared, and whose ``bench/`` is the harness.
REPO = Path(__file__).resolve().parent.parent
#: Exit status when a figure got worse beyond the threshold in every round (as the soak's).
REGRESSION_EXIT = 3
SCENARIOS = ("enqueue", "bulk", "drain")
#: Below this many rounds, two noisy runs can agree by chance: the table says so.
FEW_ROUNDS = 3
#: Virtualenvs kept in the cache, the most recently used first (~80 MB each).
KEEP_ENVIRONMENTS = 8


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench compare",
        description=(__doc__ or "").split("\n\n", 1)[0],
        epilog="bench/README.md ('Comparing two revisions') explains the figures and the flag.",
    )
    add = parser.add_argument
    add("a", metavar="A", help="the revision compared against: main, HEAD~1, a hash")
    add(
        "b",
        metavar="B",
        nargs="?",
        help="the revision under test (default: the working tree, HEAD plus its changes)",
    )
    add("--rounds", type=int, default=5, help="rounds of A and B, alternating (5)")
    add("--backends", default="postgresql,sqlite", help="postgresql,sqlite (both); or mysql")
    add(
        "--only",
        default=",".join(SCENARIOS),
        help="the harness's scenarios (enqueue,bulk,drain: one-job and bulk enqueue, drains)",
    )
    add("--drains", default="1x10,1x100", help="drains as PROCESSESxCONCURRENCY (1x10,1x100)")
    add("--async-drains", default="1x100", help="async-handler drains, as --drains, or none")
    add("--drain-jobs", type=int, help="jobs per drain (10,000; 500 with --quick)")
    add("--quick", action="store_true", help="the harness's small sizes: a smoke run")
    add("--threshold", type=float, default=5.0, help="percent a flagged change exceeds (5)")
    add("--postgres-url", help="passed to the harness (its default: $SQLQUEUE_TEST_POSTGRES_URL)")
    add("--mysql-url", help="passed to the harness (its default: $SQLQUEUE_TEST_MYSQL_URL)")
    add("--sqlite-dir", type=Path, help="passed to the harness (the system temp dir)")
    add("--timeout", type=float, help="seconds allowed per measurement (the harness's 600)")
    add(
        "--output",
        type=Path,
        help="write OUTPUT (.md) and its .json twin (bench/results/compare-<A>-<B>.md)",
    )
    add(
        "--cache-dir",
        type=Path,
        help="where each revision's virtualenv is kept ($XDG_CACHE_HOME/sqlqueue-bench)",
    )
    return parser


def _harness_arguments(args: argparse.Namespace) -> list[str]:
    """What every side's ``python -m bench`` gets besides ``--json``."""
    found = ["--only", args.only, "--runs", "1", "--backends", args.backends]
    found += ["--drains", args.drains, "--async-drains", args.async_drains]
    if args.quick:
        found.append("--quick")
    if args.drain_jobs is not None:
        found += ["--drain-jobs", str(args.drain_jobs)]
    for option in ("postgres_url", "mysql_url", "sqlite_dir", "timeout"):
        value = getattr(args, option)
        if value is not None:
            found += [f"--{option.replace('_', '-')}", str(value)]
    return found


def _load() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def _exit_on_sigterm(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds: the running side is stopped, its databases dropped


def _run_side(side: Side, harness: Path, arguments: Sequence[str], saved: Path) -> None:
    """One ``python -m bench`` of one side; its databases are dropped even if it is stopped."""
    command = [str(side.python), "-m", "bench", *arguments, "--json", str(saved)]
    log = saved.with_suffix(".log")
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command,
            cwd=harness,
            env=compare_envs.side_environment(harness),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
        try:
            code = process.wait()
        except BaseException:
            process.send_signal(signal.SIGTERM)
            process.wait()
            raise
    if code:
        text = log.read_text(encoding="utf-8", errors="replace")
        raise SystemExit(compare_envs.diagnose(text, f"{side.letter} = {side.revision.title}"))


def _rounds(
    sides: dict[str, Side], harness: Path, arguments: Sequence[str], count: int
) -> list[dict[str, Any]]:
    """Run A and B ``count`` times, alternating which goes first; each round's documents."""
    rounds: list[dict[str, Any]] = []
    for number in range(1, count + 1):
        order = "AB" if number % 2 else "BA"
        documents: dict[str, dict[str, Any]] = {}
        for letter in order:
            saved = harness.parent / f"round{number}-{letter}.json"
            began = time.monotonic()
            _run_side(sides[letter], harness, arguments, saved)
            documents[letter] = json.loads(saved.read_text(encoding="utf-8"))
            print(
                f"round {number}/{count} {letter} = {sides[letter].revision.title}: "
                f"{time.monotonic() - began:.0f} s",
                file=sys.stderr,
                flush=True,
            )
        rounds.append({"round": number, "order": order, "load": _load(), **documents})
    return rounds


def _facts_line(letter: str, side: Side, facts: dict[str, Any]) -> str:
    return (
        f"{letter} = {side.revision.title}: sqlqueue {side.imported['version']} installed in "
        f"its virtualenv ({side.revision.cache_key}); Python {facts.get('python')}, "
        f"SQLAlchemy {facts.get('sqlalchemy')}, psycopg {facts.get('psycopg')}"
    )


def _servers(facts: dict[str, Any]) -> str:
    durability = facts.get("durability", {})
    parts = [f"{facts.get('cpus')} CPUs"]
    if "postgresql" in durability:
        parts.append(f"PostgreSQL {durability['postgresql'].get('server_version')} on loopback")
    if "mysql" in durability:
        parts.append(f"MariaDB/MySQL {durability['mysql'].get('version')} on loopback")
    if "sqlite" in durability:
        parts.append(
            f"SQLite {facts.get('sqlite_library')} on {facts.get('sqlite_filesystem')} "
            f"(journal_mode={durability['sqlite'].get('journal_mode')})"
        )
    return ", ".join(parts)


def _default_output(a: Revision, b: Revision) -> Path:
    return REPO / "bench" / "results" / f"compare-{a.slug}-{b.slug}.md"


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    parser = _parser()
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.threshold < 0:
        parser.error("--rounds must be >= 1 and --threshold >= 0")
    threshold = args.threshold / 100
    a, b = compare_envs.resolve(REPO, args.a), compare_envs.resolve(REPO, args.b)
    cache = args.cache_dir or compare_envs.cache_dir()
    pythons = {
        letter: compare_envs.build(REPO, revision, cache)
        for letter, revision in zip("AB", (a, b), strict=True)
    }
    for removed in compare_envs.prune(cache, KEEP_ENVIRONMENTS, (a, b)):
        print(f"removed the least recently used virtualenv {removed.name}", file=sys.stderr)
    harness_state = compare_envs.checkout_state(REPO)
    same = compare_envs.same_build(REPO, a, b)
    arguments = _harness_arguments(args)
    output = args.output or _default_output(a, b)
    with tempfile.TemporaryDirectory(prefix="sqlqueue-compare-") as scratch:
        harness = compare_envs.copy_harness(REPO, Path(scratch) / "harness")
        sides = {
            letter: compare_envs.probe(letter, revision, pythons[letter], harness)
            for letter, revision in zip("AB", (a, b), strict=True)
        }
        for side in sides.values():
            print(
                f"{side.letter} = {side.revision.title}: sqlqueue from {side.imported['sqlqueue']}",
                file=sys.stderr,
                flush=True,
            )
        started_at = datetime.now(UTC).isoformat(timespec="seconds")
        load_at_start = _load()
        if load_at_start[0] > (os.cpu_count() or 1):
            print(
                f"warning: load average {load_at_start[0]:.1f} on {os.cpu_count()} CPUs: other "
                "work is running, expect a wide spread",
                file=sys.stderr,
            )
        started = time.monotonic()
        rounds = _rounds(sides, harness, arguments, args.rounds)
        load_at_end = _load()
        seconds = time.monotonic() - started

    found = compare_figures.figures([(_results(r["A"]), _results(r["B"])) for r in rounds])
    names = (f"A {a.short}", f"B {b.short}")
    facts = {letter: rounds[0][letter].get("environment", {}) for letter in "AB"}
    header = [
        f"python -m bench compare {' '.join(shlex.quote(arg) for arg in (argv or sys.argv[1:]))}",
        _facts_line("A", sides["A"], facts["A"]),
        _facts_line("B", sides["B"], facts["B"]),
        f"harness: bench/ of this checkout ({harness_state}), both sides; {_servers(facts['A'])}",
        f"{args.rounds} round(s), each one run of A and one of B back to back, the order "
        "alternating (A B, B A, ...): python -m bench " + " ".join(arguments),
    ]
    if same:
        header.append(
            "A and B build the same sqlqueue (pyproject.toml, README.md, sqlqueue/, migrations/ "
            "identical): an A/A run, whatever it flags is the machine's noise"
        )
    legend = (
        f"A, B: median over the rounds. B/A: per round, median (min-max). flag: every round's "
        f"B/A beyond 1 ± {args.threshold:g}% on the same side. raw B/A: the raw-SQL ceiling, the "
        "same code on both sides: how far the machine alone moved between A's and B's runs."
    )
    loads = (
        f"load average (1/5/15 min) at start {load_at_start}, at end {load_at_end}; "
        f"took {seconds:.0f} s"
    )
    if args.rounds < FEW_ROUNDS:
        legend += f" With {args.rounds} round(s) a flag is weak evidence: run {FEW_ROUNDS} or more."
    print()
    print("\n".join(header))
    print(compare_figures.table(found, names, threshold))
    print(legend)
    print(loads)
    _save(output, header, compare_figures.markdown_table(found, names, threshold), legend, loads)
    _save_json(
        output.with_suffix(".json"),
        {
            "started_at": started_at,
            "sides": {
                letter: {
                    "name": side.revision.name,
                    "commit": side.revision.commit,
                    "tree_digest": side.revision.tree_digest,
                    "imported": side.imported,
                }
                for letter, side in sides.items()
            },
            "harness": harness_state,
            "same_build": same,
            "arguments": arguments,
            "threshold": threshold,
            "load_average_at_start": load_at_start,
            "load_average_at_end": load_at_end,
            "seconds": round(seconds, 1),
            "figures": [_figure_dict(figure, threshold) for figure in found],
            "rounds": rounds,
        },
    )
    print(f"wrote {output} and {output.with_suffix('.json')}")
    regressions = [figure for figure in found if figure.verdict(threshold).regression]
    return REGRESSION_EXIT if regressions else 0


def _results(document: dict[str, Any]) -> report.Results:
    return report.Results(report.Row.from_dict(row) for row in document["rows"])


def _figure_dict(figure: Figure, threshold: float) -> dict[str, Any]:
    return {
        "backend": figure.backend,
        "key": figure.key,
        "label": figure.label,
        "unit": figure.unit,
        "higher_is_better": figure.higher_is_better,
        "a": figure.a,
        "b": figure.b,
        "ratios": figure.ratios(),
        "raw_a": figure.raw_a,
        "raw_b": figure.raw_b,
        "raw_ratios": figure.raw_ratios(),
        "flag": figure.verdict(threshold).direction,
    }


def _save(path: Path, header: list[str], markdown: str, legend: str, loads: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join(
        [
            "# python -m bench compare",
            "",
            "\n".join(f"{line}  " for line in header),
            "",
            markdown,
            "",
            legend,
            "",
            loads,
            "",
        ]
    )
    path.write_text(text, encoding="utf-8")


def _save_json(path: Path, document: dict[str, Any]) -> None:
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    raise SystemExit(main())
