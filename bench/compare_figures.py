"""``python -m bench compare``'s arithmetic: each figure of revision A against B, round by round.

A round is one ``python -m bench --runs 1 --json`` of each revision, back to back (see
bench/compare.py). A figure's change is judged on its **per-round ratios** B/A, never on the
ratio of two medians: the rounds are where the machine's own drift shows, so their spread is
the noise the change must clear. A figure is flagged when its whole min-max range of per-round
ratios lies more than ``threshold`` (5 %) away from 1, on one side: every round agrees that B
moved by more than 5 %. ``raw B/A`` is the same ratio for the raw-SQL ceiling, which is the
harness's own code on both sides: it should sit at 1, and how far it strays is the machine.

Nothing here measures, imports sqlqueue or touches a database: tests/test_bench_compare.py
checks it on made-up rounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.report import Results, Row, Spread, _columns, _number

__all__ = ["THRESHOLD", "Figure", "Verdict", "figures", "markdown_table", "table"]

#: A change smaller than this (as a fraction of A) is never flagged.
THRESHOLD = 0.05


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """Whether a figure moved beyond the threshold in every round, and which way."""

    #: "worse", "better", or "" when the rounds' ratios reach within the threshold of 1.
    direction: str
    #: The raw ceiling (the same code on both sides) moved as far the same way: the machine's
    #: drift between A's and B's runs may be all the flag shows.
    raw_too: bool

    @property
    def flagged(self) -> bool:
        return bool(self.direction)

    @property
    def regression(self) -> bool:
        return self.direction == "worse"


@dataclass(kw_only=True)
class Figure:
    """One operation on one backend: its value for A and for B in each round."""

    backend: str
    key: str
    label: str
    unit: str
    higher_is_better: bool
    a: list[float] = field(default_factory=list)
    b: list[float] = field(default_factory=list)
    raw_a: list[float] = field(default_factory=list)
    raw_b: list[float] = field(default_factory=list)

    def ratios(self) -> list[float]:
        """B / A per round; none if an A figure is 0."""
        return _ratios(self.a, self.b)

    def raw_ratios(self) -> list[float]:
        """The raw-SQL ceiling's B / A per round: the same code on both sides, the noise."""
        return _ratios(self.raw_a, self.raw_b)

    def verdict(self, threshold: float = THRESHOLD) -> Verdict:
        """Flagged when every round's ratio is beyond ``1 ± threshold`` on the same side."""
        moved = _moved(self.ratios(), threshold)
        if not moved:
            return Verdict(direction="", raw_too=False)
        improved = (moved == "up") == self.higher_is_better
        return Verdict(
            direction="better" if improved else "worse",
            raw_too=_moved(self.raw_ratios(), threshold) == moved,
        )


def _moved(ratios: Sequence[float], threshold: float) -> str:
    """``up`` or ``down`` when every ratio lies beyond ``1 ± threshold`` on that side; else ""."""
    spread = Spread.of(ratios)
    if spread is None:
        return ""
    if spread.high < 1 - threshold:
        return "down"
    if spread.low > 1 + threshold:
        return "up"
    return ""


def _ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    pairs = list(zip(a, b, strict=True))
    if not pairs or any(value <= 0 for value, _ in pairs):
        return []
    return [new / old for old, new in pairs]


def _median(row: Row, engine: str) -> float | None:
    """A row's figure for one engine in one round (the median, should a round hold more runs)."""
    spread = Spread.of(row.sqlqueue if engine == "sqlqueue" else row.raw)
    return None if spread is None else spread.median


def figures(rounds: Sequence[tuple[Results, Results]]) -> list[Figure]:
    """Every figure that A and B both measured in every round, in A's order.

    ``rounds`` holds one ``(A, B)`` pair of results per round. A figure missing from either
    side in any round is left out rather than compared on fewer rounds; so is the raw ceiling
    of a figure whose raw side is missing anywhere.
    """
    if not rounds:
        return []
    paired = [
        (
            {(row.backend, row.key): row for row in side_a.rows},
            {(row.backend, row.key): row for row in side_b.rows},
        )
        for side_a, side_b in rounds
    ]
    found = []
    for key, first in paired[0][0].items():
        pairs = [(rows_a.get(key), rows_b.get(key)) for rows_a, rows_b in paired]
        values = [
            (_median(row_a, "sqlqueue"), _median(row_b, "sqlqueue"))
            for row_a, row_b in pairs
            if row_a is not None and row_b is not None
        ]
        if len(values) != len(rounds) or any(a is None or b is None for a, b in values):
            continue
        figure = Figure(
            backend=first.backend,
            key=first.key,
            label=first.label,
            unit=first.unit,
            higher_is_better=first.higher_is_better,
            a=[a for a, _ in values if a is not None],
            b=[b for _, b in values if b is not None],
        )
        raw = [
            (_median(row_a, "raw"), _median(row_b, "raw"))
            for row_a, row_b in pairs
            if row_a is not None and row_b is not None
        ]
        if all(a is not None and b is not None for a, b in raw):
            figure.raw_a = [a for a, _ in raw if a is not None]
            figure.raw_b = [b for _, b in raw if b is not None]
        found.append(figure)
    return found


def _ratio_cell(values: Sequence[float]) -> str:
    spread = Spread.of(values)
    if spread is None:
        return "-"
    return f"{spread.median:.3f} ({spread.low:.3f}-{spread.high:.3f})"


def _flag(figure: Figure, threshold: float) -> str:
    verdict = figure.verdict(threshold)
    if not verdict.flagged:
        return ""
    change = (Spread.of(figure.ratios()) or Spread(median=1, low=1, high=1)).median - 1
    text = f"{'WORSE' if verdict.regression else 'better'} {change:+.1%}"
    return f"{text} (raw too)" if verdict.raw_too else text


def _lines(found: Sequence[Figure], names: tuple[str, str], threshold: float) -> list[list[str]]:
    lines = [
        [
            "backend",
            "operation",
            "unit",
            names[0],
            names[1],
            "B/A (min-max)",
            "raw B/A (min-max)",
            f"flag (±{threshold * 100:g}%)",
        ]
    ]
    for figure in found:
        a, b = Spread.of(figure.a), Spread.of(figure.b)
        lines.append(
            [
                figure.backend,
                figure.label,
                figure.unit,
                _number(a.median, figure.unit) if a else "-",
                _number(b.median, figure.unit) if b else "-",
                _ratio_cell(figure.ratios()),
                _ratio_cell(figure.raw_ratios()),
                _flag(figure, threshold),
            ]
        )
    return lines


def table(found: Sequence[Figure], names: tuple[str, str], threshold: float = THRESHOLD) -> str:
    """Each figure: A's and B's median over the rounds, B/A per round as median (min-max), the
    raw ceiling's B/A, and the flag. ``names`` head A's and B's columns."""
    if not found:
        return "(no figure measured by both revisions in every round)"
    return "\n".join(_columns(_lines(found, names, threshold), right={3, 4, 5, 6}))


def markdown_table(
    found: Sequence[Figure], names: tuple[str, str], threshold: float = THRESHOLD
) -> str:
    """The same table as markdown, for the saved report."""
    lines = _lines(found, names, threshold)
    rendered = ["| " + " | ".join(lines[0]) + " |", "|" + "---|" * len(lines[0])]
    rendered += ["| " + " | ".join(line) + " |" for line in lines[1:]]
    return "\n".join(rendered)
