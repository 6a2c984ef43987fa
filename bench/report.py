"""Figures and how they are shown: the one table, the JSON file, and deltas against an old run.

A :class:`Row` is one operation on one backend, with every run's value for sqlqueue and for
its raw-SQL ceiling. Medians, spreads and ratios are computed from the runs when printed or
saved, so a saved file holds everything needed to print the table again or compare with it.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Results", "Row", "Spread", "compare_table", "load", "save", "table"]

#: Bumped when the JSON layout changes in a way ``--compare`` must know about.
SCHEMA_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class Spread:
    """Median and range of a series of figures."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread | None:
        """The spread of ``values``, or ``None`` when there are none."""
        if not values:
            return None
        return cls(median=statistics.median(values), low=min(values), high=max(values))

    def as_dict(self) -> dict[str, float]:
        return {"median": self.median, "low": self.low, "high": self.high}


@dataclass(kw_only=True)
class Row:
    """One operation on one backend: each run's sqlqueue figure and its raw-SQL ceiling."""

    backend: str
    key: str
    label: str
    unit: str
    higher_is_better: bool
    sqlqueue: list[float] = field(default_factory=list)
    raw: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: Per engine, one entry per run of whatever else is worth keeping (JSON only).
    details: dict[str, list[Any]] = field(default_factory=dict)

    def add(self, engine: str, value: float, detail: Any = None) -> None:
        """File one run's figure for ``engine`` ("sqlqueue" or "raw"), with optional details."""
        (self.sqlqueue if engine == "sqlqueue" else self.raw).append(value)
        if detail is not None:
            self.details.setdefault(engine, []).append(detail)

    def ratios(self) -> list[float]:
        """sqlqueue / raw per run (runs measured back to back); none if a raw figure is 0."""
        pairs = list(zip(self.sqlqueue, self.raw, strict=False))
        if not pairs or any(raw <= 0 for _, raw in pairs):
            return []
        return [sq / raw for sq, raw in pairs]

    def as_dict(self) -> dict[str, Any]:
        def series(values: list[float]) -> dict[str, Any] | None:
            spread = Spread.of(values)
            return None if spread is None else {**spread.as_dict(), "runs": values}

        return {
            "backend": self.backend,
            "key": self.key,
            "label": self.label,
            "unit": self.unit,
            "higher_is_better": self.higher_is_better,
            "sqlqueue": series(self.sqlqueue),
            "raw": series(self.raw),
            "sqlqueue_to_raw": series(self.ratios()),
            "notes": self.notes,
            "details": self.details,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Row:
        def runs(series: dict[str, Any] | None) -> list[float]:
            return [float(v) for v in series["runs"]] if series else []

        return cls(
            backend=str(data["backend"]),
            key=str(data["key"]),
            label=str(data["label"]),
            unit=str(data["unit"]),
            higher_is_better=bool(data["higher_is_better"]),
            sqlqueue=runs(data.get("sqlqueue")),
            raw=runs(data.get("raw")),
            notes=[str(note) for note in data.get("notes", [])],
            details=dict(data.get("details", {})),
        )


class Results:
    """The rows of one benchmark, in the order they were first measured."""

    def __init__(self, rows: Iterable[Row] = ()) -> None:
        self._rows: dict[tuple[str, str], Row] = {(r.backend, r.key): r for r in rows}

    @property
    def rows(self) -> list[Row]:
        return list(self._rows.values())

    def row(self, backend: str, key: str, label: str, unit: str, *, higher_is_better: bool) -> Row:
        """The row for ``(backend, key)``, created on first use."""
        found = self._rows.get((backend, key))
        if found is None:
            found = Row(
                backend=backend,
                key=key,
                label=label,
                unit=unit,
                higher_is_better=higher_is_better,
            )
            self._rows[(backend, key)] = found
        return found


# -- the table -----------------------------------------------------------------------------------


def _number(value: float, unit: str) -> str:
    if unit == "jobs/s":
        return f"{value:,.0f}"
    if unit == "ms":
        return f"{value:,.1f}"
    return f"{value:,.2f}"


def _spread(values: Sequence[float], unit: str) -> str:
    spread = Spread.of(values)
    if spread is None:
        return "-"
    low, high = _number(spread.low, unit), _number(spread.high, unit)
    return f"{_number(spread.median, unit)} ({low}-{high})"


def _columns(lines: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    rendered = []
    for line in lines:
        cells = [
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(line, widths, strict=True))
        ]
        rendered.append("  ".join(cells).rstrip())
    rendered.insert(1, "-" * len(rendered[0]))
    return rendered


def table(rows: Sequence[Row]) -> str:
    """Every row: median (min-max) for sqlqueue, raw SQL, and their ratio."""
    lines = [["backend", "operation", "unit", "sqlqueue", "raw SQL", "sqlqueue/raw", "notes"]]
    for row in rows:
        lines.append(
            [
                row.backend,
                row.label,
                row.unit,
                _spread(row.sqlqueue, row.unit),
                _spread(row.raw, row.unit),
                _spread(row.ratios(), "ratio"),
                "; ".join(row.notes),
            ]
        )
    return "\n".join(_columns(lines, right={3, 4, 5}))


def compare_table(old: Sequence[Row], new: Sequence[Row]) -> str:
    """Old and new medians of every row both runs have, with the change and its direction."""
    before = {(row.backend, row.key): row for row in old}
    lines = [["backend", "operation", "unit", "sqlqueue old", "new", "change", "ratio old", "new"]]
    for row in new:
        previous = before.get((row.backend, row.key))
        if previous is None:
            continue
        was, now = Spread.of(previous.sqlqueue), Spread.of(row.sqlqueue)
        if was is None or now is None:
            continue
        change = "-"
        if was.median:
            delta = (now.median - was.median) / was.median
            improved = (delta > 0) == row.higher_is_better
            change = f"{delta:+.1%} {'better' if improved else 'worse'}" if delta else "0.0%"
        ratio_was, ratio_now = Spread.of(previous.ratios()), Spread.of(row.ratios())
        lines.append(
            [
                row.backend,
                row.label,
                row.unit,
                _number(was.median, row.unit),
                _number(now.median, row.unit),
                change,
                f"{ratio_was.median:.2f}" if ratio_was else "-",
                f"{ratio_now.median:.2f}" if ratio_now else "-",
            ]
        )
    if len(lines) == 1:
        return "(no operation in common with the old run)"
    return "\n".join(_columns(lines, right={3, 4, 5, 6, 7}))


# -- JSON ----------------------------------------------------------------------------------------


def save(path: Path, results: Results, environment: dict[str, Any], extra: dict[str, Any]) -> None:
    """Write every run of every row, plus the environment, as JSON."""
    document = {
        "schema": SCHEMA_VERSION,
        "environment": environment,
        "rows": [row.as_dict() for row in results.rows],
        **extra,
    }
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


def load(path: Path) -> tuple[Results, dict[str, Any]]:
    """The rows and environment of a file :func:`save` wrote."""
    document = json.loads(path.read_text(encoding="utf-8"))
    if document.get("schema") != SCHEMA_VERSION:
        raise SystemExit(f"{path}: not a benchmark file of schema {SCHEMA_VERSION}")
    rows = [Row.from_dict(row) for row in document["rows"]]
    return Results(rows), dict(document.get("environment", {}))
