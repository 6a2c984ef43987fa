"""``python -m bench compare``'s judgement and bookkeeping, on made-up rounds: no database.

The per-round ratios, their spread and the flag (bench/compare_figures.py); which figures
both revisions measured; the table; what a side's failure is reported as; the working tree's
snapshot and the virtualenv cache (bench/compare_envs.py). The comparison end to end (two
revisions built and measured) is ``tests/test_bench_smoke.py``'s, marked ``bench_smoke``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import compare, compare_envs
from bench.compare_figures import Figure, figures, markdown_table, table
from bench.report import Results, Row

ROOT = Path(__file__).resolve().parent.parent


def _figure(a: list[float], b: list[float], *, higher_is_better: bool = True) -> Figure:
    return Figure(
        backend="postgresql",
        key="drain.10000.p1c10",
        label="drain 10,000, 1 proc x concurrency 10",
        unit="jobs/s" if higher_is_better else "ms",
        higher_is_better=higher_is_better,
        a=a,
        b=b,
        raw_a=[10_000.0] * len(a),
        raw_b=[10_000.0] * len(a),
    )


def _results(values: dict[str, tuple[float, float]]) -> Results:
    """One side's results of one round: row key -> (sqlqueue, raw)."""
    rows = []
    for key, (sqlqueue, raw) in values.items():
        rows.append(
            Row(
                backend="sqlite",
                key=key,
                label=key.replace(".", " "),
                unit="jobs/s",
                higher_is_better=True,
                sqlqueue=[sqlqueue],
                raw=[raw],
            )
        )
    return Results(rows)


def test_ratios_are_b_over_a_round_by_round() -> None:
    figure = _figure([100.0, 200.0, 400.0], [110.0, 180.0, 400.0])

    assert figure.ratios() == pytest.approx([1.1, 0.9, 1.0])
    assert figure.raw_ratios() == [1.0, 1.0, 1.0]


def test_a_slowdown_in_every_round_beyond_five_percent_is_flagged_worse() -> None:
    verdict = _figure([100.0, 100.0, 100.0], [90.0, 94.0, 80.0]).verdict()

    assert verdict.direction == "worse"
    assert verdict.regression
    assert not verdict.raw_too


def test_a_speedup_in_every_round_beyond_five_percent_is_flagged_better() -> None:
    verdict = _figure([100.0, 100.0], [106.0, 130.0]).verdict()

    assert verdict.direction == "better"
    assert not verdict.regression


@pytest.mark.parametrize(
    "b",
    [
        [90.0, 90.0, 96.0],  # one round within 5 %: the spread reaches in
        [80.0, 120.0, 80.0],  # the rounds disagree about the direction
        [95.0, 95.0, 95.0],  # exactly 5 %: not more than 5 %
        [104.0, 103.0, 101.0],  # a real but small change
    ],
)
def test_a_change_the_spread_reaches_within_five_percent_of_is_not_flagged(
    b: list[float],
) -> None:
    assert not _figure([100.0] * len(b), b).verdict().flagged


def test_the_threshold_is_a_parameter() -> None:
    figure = _figure([100.0, 100.0], [97.0, 96.0])

    assert not figure.verdict().flagged
    assert figure.verdict(0.02).regression


def test_where_lower_is_better_a_rise_is_worse() -> None:
    assert _figure([10.0, 10.0], [12.0, 13.0], higher_is_better=False).verdict().regression
    verdict = _figure([10.0, 10.0], [8.0, 9.0], higher_is_better=False).verdict()
    assert verdict.direction == "better"


def test_a_flag_the_raw_ceiling_shares_says_so() -> None:
    figure = _figure([100.0, 100.0], [120.0, 125.0])
    figure.raw_b = [12_000.0, 11_000.0]  # the same harness code 10-20 % faster: the machine

    assert figure.verdict().raw_too
    assert "(raw too)" in table([figure], ("A", "B"))


def test_no_rounds_or_a_zero_figure_flags_nothing() -> None:
    assert not _figure([], []).verdict().flagged
    assert not _figure([0.0, 100.0], [50.0, 50.0]).verdict().flagged


def test_figures_pair_each_round_of_a_with_the_same_round_of_b() -> None:
    rounds = [
        (_results({"drain": (100.0, 1000.0)}), _results({"drain": (90.0, 1100.0)})),
        (_results({"drain": (200.0, 1000.0)}), _results({"drain": (150.0, 900.0)})),
    ]

    (figure,) = figures(rounds)

    assert figure.a == [100.0, 200.0]
    assert figure.b == [90.0, 150.0]
    assert figure.ratios() == pytest.approx([0.9, 0.75])
    assert figure.raw_ratios() == pytest.approx([1.1, 0.9])
    assert figure.verdict().regression


def test_a_figure_missing_from_any_round_or_either_side_is_left_out() -> None:
    both = {"enqueue": (1.0, 2.0), "drain": (3.0, 4.0)}
    rounds = [
        (_results({**both, "only_a": (1.0, 1.0)}), _results({**both, "only_b": (1.0, 1.0)})),
        (_results({"drain": (3.0, 4.0)}), _results(both)),
    ]

    assert [figure.key for figure in figures(rounds)] == ["drain"]
    assert figures([]) == []


def test_the_table_shows_each_median_the_ratio_spread_and_the_flag() -> None:
    figure = _figure([6000.0, 6200.0, 6100.0], [5000.0, 5100.0, 5600.0])

    text = table([figure], ("A main", "B tree"))
    header, rule, line = text.splitlines()

    assert "A main" in header
    assert "B tree" in header
    assert "flag (±5%)" in header
    assert set(rule) == {"-"}
    assert "6,100" in line  # A's median
    assert "5,100" in line  # B's median
    assert "0.833 (0.823-0.918)" in line  # B/A per round: median (min-max)
    assert "1.000 (1.000-1.000)" in line  # the raw ceiling did not move
    assert "WORSE -16.7%" in line


def test_the_markdown_table_has_the_same_cells() -> None:
    figure = _figure([100.0, 100.0], [100.0, 101.0])

    lines = markdown_table([figure], ("A x", "B y")).splitlines()

    assert lines[0].startswith("| backend | operation |")
    assert lines[1] == "|---|---|---|---|---|---|---|---|"
    assert "| 1.005 (1.000-1.010) |" in lines[2]
    assert table([], ("A", "B")).startswith("(no figure")


def test_the_harness_gets_one_run_of_the_chosen_scenarios_and_sizes() -> None:
    args = compare._parser().parse_args(
        ["main", "--quick", "--backends", "sqlite", "--drain-jobs", "300", "--timeout", "60"]
    )

    assert compare._harness_arguments(args) == [
        "--only",
        "enqueue,bulk,drain",
        "--runs",
        "1",
        "--backends",
        "sqlite",
        "--drains",
        "1x10,1x100",
        "--async-drains",
        "1x100",
        "--quick",
        "--drain-jobs",
        "300",
        "--timeout",
        "60.0",
    ]
    assert args.b is None  # the working tree


def test_a_revision_without_what_the_harness_uses_is_named_as_such() -> None:
    stderr = (
        "Traceback (most recent call last):\n"
        '  File "bench/drain.py", line 31, in <module>\n'
        "ImportError: cannot import name 'JobRequest' from 'sqlqueue' (/x/sqlqueue/__init__.py)\n"
    )

    said = compare_envs.diagnose(stderr, "A = old (1234567)")

    assert said.startswith("A = old (1234567): the harness (this checkout's bench/) uses")
    assert "cannot import name 'JobRequest'" in said
    assert "the benchmark failed" in compare_envs.diagnose("SystemExit: boom", "B")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def test_the_working_tree_is_head_until_a_build_file_changes(tmp_path: Path) -> None:
    (tmp_path / "sqlqueue").mkdir()
    (tmp_path / "sqlqueue" / "__init__.py").write_text("x = 1\n")
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    (tmp_path / "notes.md").write_text("notes\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "sqlqueue", "pyproject.toml", "notes.md")
    _git(tmp_path, "commit", "-q", "-m", "one")
    head = _git(tmp_path, "rev-parse", "HEAD")

    assert compare_envs.resolve(tmp_path, "HEAD") == compare_envs.Revision(name="HEAD", commit=head)
    clean = compare_envs.resolve(tmp_path, None)
    assert clean.commit == head
    assert clean.tree_digest is None  # shares HEAD's virtualenv
    assert clean.cache_key == compare_envs.resolve(tmp_path, "HEAD").cache_key

    (tmp_path / "notes.md").write_text("other notes\n")  # not built into the wheel
    assert compare_envs.resolve(tmp_path, None).tree_digest is None

    (tmp_path / "sqlqueue" / "new.py").write_text("y = 2\n")  # untracked, built
    changed = compare_envs.resolve(tmp_path, None)
    assert changed.tree_digest is not None
    assert changed.short == f"{head[:7]}+changes"
    assert changed.cache_key.startswith("tree-")
    assert compare_envs.resolve(tmp_path, None) == changed  # the digest is of the content

    (tmp_path / "sqlqueue" / "new.py").write_text("y = 3\n")
    assert compare_envs.resolve(tmp_path, None).tree_digest != changed.tree_digest

    with pytest.raises(SystemExit, match="not a commit"):
        compare_envs.resolve(tmp_path, "no-such-branch")


def test_revisions_that_differ_only_outside_the_build_files_are_an_a_a_run(
    tmp_path: Path,
) -> None:
    (tmp_path / "sqlqueue").mkdir()
    (tmp_path / "sqlqueue" / "__init__.py").write_text("x = 1\n")
    (tmp_path / "notes.md").write_text("notes\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "sqlqueue", "notes.md")
    _git(tmp_path, "commit", "-q", "-m", "one")
    (tmp_path / "notes.md").write_text("more notes\n")
    _git(tmp_path, "commit", "-q", "-am", "docs only")
    (tmp_path / "sqlqueue" / "__init__.py").write_text("x = 2\n")
    _git(tmp_path, "commit", "-q", "-am", "code")

    def revision(name: str) -> compare_envs.Revision:
        return compare_envs.resolve(tmp_path, name)

    assert compare_envs.same_build(tmp_path, revision("HEAD~2"), revision("HEAD~1"))
    assert not compare_envs.same_build(tmp_path, revision("HEAD~1"), revision("HEAD"))
    assert compare_envs.same_build(tmp_path, revision("HEAD"), compare_envs.resolve(tmp_path, None))


def test_the_cache_keeps_the_most_recently_used_virtualenvs(tmp_path: Path) -> None:
    in_use = compare_envs.Revision(name="main", commit="a" * 40)
    # Last used at these times; the one in use is the oldest, and kept all the same.
    for key, used in {"older": 1, "old": 2, "recent": 3, in_use.cache_key: 0}.items():
        (tmp_path / key).mkdir()
        (tmp_path / key / "built.json").write_text("{}")
        (tmp_path / f"{key}.lock").write_text("")
        os.utime(tmp_path / key / "built.json", (used, used))

    removed = compare_envs.prune(tmp_path, 2, [in_use])

    assert sorted(home.name for home in removed) == ["old", "older"]
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        ["recent", "recent.lock", in_use.cache_key, f"{in_use.cache_key}.lock"]
    )


def test_the_comparison_imports_no_sqlqueue_itself() -> None:
    """It runs from any interpreter (a bare nox virtualenv): the sides import sqlqueue."""
    code = "import sys, bench.compare; print('sqlqueue' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )

    assert done.stdout.strip() == "False"
