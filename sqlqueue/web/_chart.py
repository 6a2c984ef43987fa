"""The throughput chart, drawn on the server as SVG geometry: one polyline of jobs succeeded per
minute and one of failures (failed and dead) over the minutes of :class:`sqlqueue.Activity`.
No chart library, no script: the page works offline and the template only places numbers."""

from __future__ import annotations

from dataclasses import dataclass

from sqlqueue._operators.stats import Activity

__all__ = ["Chart", "chart_of"]

WIDTH = 720
HEIGHT = 160
_LEFT = 40
_RIGHT = 8
_TOP = 10
_BOTTOM = 22


@dataclass(frozen=True, kw_only=True)
class Chart:
    """What the SVG template draws: the two lines' points, the y axis's top value, the x axis's
    labels (x, text, text-anchor), and the totals for the legend."""

    width: int
    height: int
    plot_left: int
    plot_right: int
    plot_top: int
    plot_bottom: int
    succeeded_points: str
    failures_points: str
    top_value: int
    x_labels: tuple[tuple[float, str, str], ...]
    total_succeeded: int
    total_failures: int
    minutes: int


def _nice_top(value: int) -> int:
    """The y axis's top: at least ``value``, rounded up to 1, 2 or 5 times a power of ten."""
    power = 1
    while True:
        for factor in (1, 2, 5):
            if power * factor >= value:
                return power * factor
        power *= 10


def chart_of(activity: Activity) -> Chart:
    """The chart of ``activity``'s minutes, oldest at the left."""
    minutes = activity.minutes
    succeeded = [minute.succeeded for minute in minutes]
    failures = [minute.failed + minute.dead for minute in minutes]
    top = _nice_top(max([*succeeded, *failures, 1]))
    right = WIDTH - _RIGHT
    bottom = HEIGHT - _BOTTOM
    step = (right - _LEFT) / max(len(minutes) - 1, 1)

    def points(values: list[int]) -> str:
        return " ".join(
            f"{_LEFT + index * step:.1f},{bottom - (bottom - _TOP) * value / top:.1f}"
            for index, value in enumerate(values)
        )

    count = len(minutes)
    every = max(count // 4, 1)
    labels = tuple(
        (_LEFT + index * step, f"-{count - index} min", "start" if index == 0 else "middle")
        for index in range(0, count - every // 2, every)
    )
    return Chart(
        width=WIDTH,
        height=HEIGHT,
        plot_left=_LEFT,
        plot_right=right,
        plot_top=_TOP,
        plot_bottom=bottom,
        succeeded_points=points(succeeded),
        failures_points=points(failures),
        top_value=top,
        x_labels=(*labels, (float(right), "now", "end")),
        total_succeeded=sum(succeeded),
        total_failures=sum(failures),
        minutes=count,
    )
