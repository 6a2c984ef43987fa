"""The seventh status, ``waiting`` (a workflow step whose upstream steps have not all ended),
counted where an operator looks: ``sqlqueue stats`` (its tables and ``--json``) and the web
page's overview (its tile, and the waiting column of its queue and job type tables), per
queue and per job type, apart from ``queued``. Every backend."""

from __future__ import annotations

import json
import re

import pytest

import sqlqueue
from sqlqueue import JobRequest, Workflow
from sqlqueue.web import create_app
from tests._support import run_cli
from tests._support.web import browser_client
from tests.conftest import Backend

pytestmark = pytest.mark.timeout(180)

#: What :func:`held_order` leaves waiting, by queue and by job type (and queued, to tell
#: the two apart).
WAITING = {"orders": 1, "mail": 2}
WAITING_BY_TYPE = {"orders.pack": 1, "mail.receipt": 2}
QUEUED = {"orders": 1, "mail": 1}


def _nothing() -> None:
    """No worker runs here: the tasks are declared only so that their jobs may be enqueued."""


def held_order(backend: Backend) -> sqlqueue.Queue:
    """A diamond that no worker ran: ``charge`` queued, ``pack`` and ``receipt`` after it and
    ``confirm`` after both waiting; and one plain queued job beside it in ``mail``."""
    queue = backend.queue()
    for job_type, name in [
        ("billing.charge", "orders"), ("orders.pack", "orders"),
        ("mail.receipt", "mail"), ("mail.send", "mail"),
    ]:  # fmt: skip
        queue.task(job_type, queue=name)(_nothing)
    wf = Workflow()
    wf.add("charge", JobRequest(job_type="billing.charge", queue="orders"))
    wf.add("pack", JobRequest(job_type="orders.pack", queue="orders"), after=["charge"])
    wf.add("receipt", JobRequest(job_type="mail.receipt", queue="mail"), after=["charge"])
    wf.add("confirm", JobRequest(job_type="mail.receipt", queue="mail"), after=["pack", "receipt"])
    with queue.engine.begin() as conn:
        queue.enqueue_workflow(conn, wf)
        queue.enqueue(conn, "mail.send", queue="mail")
    return queue


def text_cell(table: str, row: str, column: str) -> str:
    """The cell of ``table`` (the CLI's left-aligned text) in row ``row`` (its first cell) and
    column ``column``: columns start where their header does."""
    header, *lines = table.splitlines()
    start = re.search(rf"(?:^|  ){re.escape(column)}(?:  |$)", header)
    assert start is not None, f"no column {column!r} in {header!r}"
    offset = start.start() + (0 if start.start() == 0 else 2)
    (line,) = [line for line in lines if line.split()[0] == row]
    return line[offset:].split()[0]


def html_cell(html: str, table_id: str, row: str, column: str) -> str:
    """The cell in column ``column`` of the overview's table ``table_id``, in the row whose
    first cell links ``row`` (a queue, a job type)."""
    table = html.split(f'id="{table_id}"')[1].split("</table>")[0]
    head, body = table.split("</thead>")
    headers = re.findall(r"<th[^>]*>([^<]*)</th>", head)
    (found,) = [tr for tr in body.split("<tr")[1:] if f">{row}</a></td>" in tr]
    cells: list[str] = re.findall(r"<td[^>]*>(.*?)</td>", found, flags=re.DOTALL)
    return cells[headers.index(column)].strip()


def test_stats_counts_waiting_steps_in_its_json_and_its_tables(backend: Backend) -> None:
    held_order(backend)

    machine = run_cli("stats", "--json", url=backend.url)
    assert machine.returncode == 0, machine.stderr
    stats = json.loads(machine.stdout)
    assert (stats["by_status"]["waiting"], stats["by_status"]["queued"]) == (3, 2)
    for name, waiting in WAITING.items():
        by_status = stats["queues"][name]["by_status"]
        assert (by_status["waiting"], by_status["queued"]) == (waiting, QUEUED[name])
    for job_type, waiting in WAITING_BY_TYPE.items():
        assert stats["job_types"][job_type]["waiting"] == waiting

    human = run_cli("stats", url=backend.url)
    assert human.returncode == 0, human.stderr
    queues, types = human.stdout.split("\n\n")[:2]
    assert text_cell(queues, "(all)", "waiting") == "3"
    assert text_cell(queues, "(all)", "queued") == "2"
    for name, waiting in WAITING.items():
        assert text_cell(queues, name, "waiting") == str(waiting)
    for job_type, waiting in WAITING_BY_TYPE.items():
        assert text_cell(types, job_type, "waiting") == str(waiting)
    assert text_cell(types, "billing.charge", "waiting") == "0"


def test_the_overview_counts_waiting_steps_in_its_tile_and_tables(backend: Backend) -> None:
    queue = held_order(backend)
    page = browser_client(create_app(queue)).get("/")
    assert page.status_code == 200
    html = page.text
    assert '<span class="figure" data-count="waiting">3</span>' in html
    assert '<span class="figure" data-count="queued">2</span>' in html
    for name, waiting in WAITING.items():
        assert html_cell(html, "queues", name, "waiting") == str(waiting)
        assert html_cell(html, "queues", name, "queued") == str(QUEUED[name])
    for job_type, waiting in WAITING_BY_TYPE.items():
        assert html_cell(html, "job-types", job_type, "waiting") == str(waiting)
    assert html_cell(html, "job-types", "billing.charge", "waiting") == "0"
