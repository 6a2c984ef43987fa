"""A workflow's graph laid out for an inline SVG drawn on the server: steps in columns by depth
(a step's column is one past its deepest upstream), left to right, each column ordered to keep
a step near its upstreams; edges as curves from a step to each step after it. Geometry only —
the template draws it with classes (no inline styles: the page's Content-Security-Policy
refuses them) and no script."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlqueue._workflow import WorkflowStatus

__all__ = ["MAX_DRAWN_STEPS", "Drawing", "Edge", "Node", "draw"]

#: Above this many steps the page shows the table alone: a drawing that big is read by nobody.
MAX_DRAWN_STEPS = 80
NODE_WIDTH = 168
NODE_HEIGHT = 34
COLUMN_GAP = 56
ROW_GAP = 14
MARGIN = 6
#: Characters of a step's name shown in its box (the full name is its tooltip).
LABEL_CHARS = 20


@dataclass(frozen=True, kw_only=True)
class Node:
    """A step's box: where, its name (and the part of it that fits), its job and status."""

    name: str
    label: str
    job_id: int
    status: str
    blocked: bool
    x: int
    y: int


@dataclass(frozen=True, kw_only=True)
class Edge:
    """A curve from an upstream step's box to a downstream one's, as an SVG path."""

    upstream: str
    downstream: str
    path: str


@dataclass(frozen=True, kw_only=True)
class Drawing:
    """What the template draws: the boxes, the curves, and the picture's size."""

    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    width: int
    height: int
    node_width: int = NODE_WIDTH
    node_height: int = NODE_HEIGHT


def _columns(after: Mapping[str, tuple[str, ...]]) -> list[list[str]]:
    """The steps (given in topological order) by depth, each column ordered by where its
    steps' upstreams sit in the column before (the barycentre), ties in topological order."""
    depth: dict[str, int] = {}
    for name, upstreams in after.items():
        depth[name] = 1 + max((depth[up] for up in upstreams), default=-1)
    columns: list[list[str]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for name in after:
        columns[depth[name]].append(name)
    row: dict[str, float] = {name: float(index) for index, name in enumerate(columns[0])}
    for column in columns[1:]:
        centre = {name: sum(row[up] for up in after[name]) / len(after[name]) for name in column}
        column.sort(key=centre.__getitem__)  # a stable sort: ties stay in topological order
        row.update((name, float(index)) for index, name in enumerate(column))
    return columns


def draw(workflow: WorkflowStatus) -> Drawing | None:
    """``workflow``'s graph laid out, or ``None`` when it has more than
    :data:`MAX_DRAWN_STEPS` steps."""
    steps = workflow.steps
    if not steps or len(steps) > MAX_DRAWN_STEPS:
        return None
    blocked = set(workflow.blocked_by)
    columns = _columns({name: step.after for name, step in steps.items()})
    place: dict[str, tuple[int, int]] = {}
    nodes: list[Node] = []
    for index, column in enumerate(columns):
        for row, name in enumerate(column):
            x = MARGIN + index * (NODE_WIDTH + COLUMN_GAP)
            y = MARGIN + row * (NODE_HEIGHT + ROW_GAP)
            place[name] = (x, y)
            label = name if len(name) <= LABEL_CHARS else name[: LABEL_CHARS - 1] + "…"
            step = steps[name]
            nodes.append(
                Node(
                    name=name,
                    label=label,
                    job_id=step.job_id,
                    status=step.status.value,
                    blocked=name in blocked,
                    x=x,
                    y=y,
                )
            )
    edges: list[Edge] = []
    for name, step in steps.items():
        to_x, to_y = place[name]
        for upstream in step.after:
            from_x, from_y = place[upstream]
            start_x, start_y = from_x + NODE_WIDTH, from_y + NODE_HEIGHT // 2
            end_x, end_y = to_x - 4, to_y + NODE_HEIGHT // 2  # room for the arrowhead
            bend = (end_x - start_x) // 2
            path = (
                f"M{start_x},{start_y} C{start_x + bend},{start_y} "
                f"{end_x - bend},{end_y} {end_x},{end_y}"
            )
            edges.append(Edge(upstream=upstream, downstream=name, path=path))
    tallest = max(len(column) for column in columns)
    return Drawing(
        nodes=tuple(nodes),
        edges=tuple(edges),
        width=2 * MARGIN + len(columns) * NODE_WIDTH + (len(columns) - 1) * COLUMN_GAP,
        height=2 * MARGIN + tallest * NODE_HEIGHT + (tallest - 1) * ROW_GAP,
    )
