"""The web page's Workflows list and workflow page (issues 25 and 29) over HTTP on every backend:
what they show (counts, the steps in topological order, the steps holding a workflow up, its
graph), the requeue of a dead step from the workflow page and its effect in the database, a
step's job page linking its workflow, the list read in a fixed number of statements however
many workflows it shows, and the refusals: unknown and hostile ids, ``read_only`` and
``authorize``. Through the ASGI app itself, as in ``test_web.py``."""

from __future__ import annotations

import re
from typing import Any

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue import JobRequest, JobStatus, Workflow
from tests._support import drain
from tests._support.statements import statements
from tests._support.web import token_of
from tests.conftest import Backend
from tests.test_web import client, dead_snapshot

#: The order's steps in the order they run: the workflow page lists them so.
ORDER_STEPS = ["charge", "receipt", "notify", "complete"]


def order_queue(backend: Backend) -> sqlqueue.Queue:
    """The order's tasks: a warehouse webhook that dies while ``broken`` is in its payload."""
    queue = backend.queue()

    @queue.task("billing.charge")
    def charge(order: int) -> dict[str, int]:
        return {"order": order, "cents": 4200}

    @queue.task("mail.receipt")
    def receipt(order: int) -> None:
        return None

    @queue.task("warehouse.notify", max_attempts=1)
    def notify(order: int, broken: bool = False) -> None:
        if broken:
            raise ConnectionError("warehouse webhook refused: 503")

    @queue.task("orders.complete")
    def complete(order: int) -> None:
        return None

    return queue


def order_workflow(order: int, *, broken: bool = False, on_dead: Any = "wait") -> Workflow:
    """charge, then receipt and notify side by side, then complete after both."""
    wf = Workflow(on_dead=on_dead)
    wf.add("charge", JobRequest(job_type="billing.charge", payload={"order": order}))
    wf.add(
        "notify",
        JobRequest(job_type="warehouse.notify", payload={"order": order, "broken": broken}),
        after=["charge"],
    )
    wf.add(
        "receipt", JobRequest(job_type="mail.receipt", payload={"order": order}), after=["charge"]
    )
    wf.add(
        "complete",
        JobRequest(job_type="orders.complete", payload={"order": order}),
        after=["receipt", "notify"],
    )
    return wf


def orders(backend: Backend) -> tuple[sqlqueue.Queue, dict[str, sqlqueue.WorkflowHandle]]:
    """Three orders run by a burst worker: one done, one held up by its dead webhook, one whose
    dead webhook cancelled the rest; and a plain batch, which no workflow list shows."""
    queue = order_queue(backend)
    handles = {}
    for name, order, broken, on_dead in (
        ("done", 1, False, "wait"),
        ("held", 2, True, "wait"),
        ("cancelled", 3, True, "cancel"),
    ):
        handles[name] = queue.enqueue_workflow(
            queue.engine, order_workflow(order, broken=broken, on_dead=on_dead)
        )
    with queue.engine.begin() as conn:
        queue.enqueue_batch(conn, [JobRequest(job_type="mail.receipt", payload={"order": 9})])
    drain(queue)
    return queue, handles


def _rows(html: str, table: str, key: str) -> list[str]:
    """The ``data-<key>`` of each row of table ``table``, in page order."""
    body = html.split(f'id="{table}"', 1)[1].split("</table>", 1)[0]
    return re.findall(rf'<tr data-{key}="([^"]+)"', body)


def _row(html: str, table: str, attribute: str) -> str:
    match = re.search(rf"<tr {attribute}[^>]*>(.*?)</tr>", html.split(f'id="{table}"', 1)[1], re.S)
    assert match is not None, f"no row {attribute} in #{table}"
    return match.group(1)


# -- the read model -----------------------------------------------------------------------------


def test_workflows_lists_each_with_the_counts_and_blocked_steps_of_its_full_status(
    backend: Backend,
) -> None:
    queue, handles = orders(backend)

    listed = queue.workflows()

    assert [summary.id for summary in listed] == sorted(
        (handle.id for handle in handles.values()), reverse=True
    )
    for summary in listed:
        status = queue.get_workflow(summary.id)
        assert status is not None
        assert dict(summary.counts) == dict(status.counts)
        assert summary.blocked_by == status.blocked_by
        assert (summary.total, summary.on_dead) == (len(status.steps), status.on_dead)
        assert (summary.finished_at, summary.created_at) == (status.finished_at, status.created_at)
    by_id = {summary.id: summary for summary in listed}
    held = by_id[handles["held"].id]
    assert (held.blocked_by, held.finished, held.done) == (("notify",), False, 3)
    assert held.counts[JobStatus.WAITING] == 1
    cancelled = by_id[handles["cancelled"].id]
    assert (cancelled.blocked_by, cancelled.finished) == ((), True)
    assert cancelled.counts[JobStatus.CANCELLED] == 1
    assert by_id[handles["done"].id].counts[JobStatus.SUCCEEDED] == 4
    assert queue.workflow_summary(handles["held"].id) == held
    older = queue.workflows(limit=1, before_id=handles["cancelled"].id)
    assert [summary.id for summary in older] == [handles["held"].id]


def test_blocked_by_names_only_dead_steps_that_hold_a_waiting_step_as_get_workflow_does(
    backend: Backend,
) -> None:
    queue = order_queue(backend)

    @queue.task("audit", max_attempts=1)
    def audit(order: int) -> None:
        raise ValueError("audit log is full")

    def with_dead_leaf(on_dead: Any) -> Workflow:
        wf = order_workflow(5, broken=True, on_dead=on_dead)
        wf.add("audit", JobRequest(job_type="audit", payload={"order": 5}), after=["charge"])
        return wf

    @queue.task("slow", queue="later")
    def slow() -> None:
        return None

    held = queue.enqueue_workflow(queue.engine, with_dead_leaf("wait"))
    ran = queue.enqueue_workflow(queue.engine, with_dead_leaf("run"))
    pending = Workflow(on_dead="run")  # its dead step's downstream still waits for another
    pending.add("dies", JobRequest(job_type="audit", payload={"order": 6}))
    pending.add("slow", JobRequest(job_type="slow"))
    pending.add("last", JobRequest(job_type="slow"), after=["dies", "slow"])
    waiting = queue.enqueue_workflow(queue.engine, pending)
    drain(queue, queues=["default"])

    def both(workflow_id: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        summary, status = queue.workflow_summary(workflow_id), queue.get_workflow(workflow_id)
        assert summary is not None
        assert status is not None
        return summary.blocked_by, status.blocked_by

    # "audit" died too, but nothing waits after it: it holds nothing up.
    assert both(held.id) == (("notify",), ("notify",))
    assert both(ran.id) == ((), ())  # under "run" the steps after a dead one ran
    assert both(waiting.id) == ((), ())  # and one still waiting waits for "slow", not "dies"
    queue.requeue(held.job_ids["notify"], by="ops", reason="retry it")
    assert both(held.id) == ((), ())  # its dead job is no step's any more; its new one queued


def test_workflow_summary_of_a_plain_batch_or_no_workflow_is_none_and_bad_limits_are_refused(
    backend: Backend,
) -> None:
    queue = order_queue(backend)
    with queue.engine.begin() as conn:
        batch = queue.enqueue_batch(
            conn, [JobRequest(job_type="mail.receipt", payload={"order": 1})]
        )

    assert queue.workflow_summary(batch.id) is None
    assert queue.workflow_summary(987_654) is None
    assert queue.workflows() == []
    with pytest.raises(sqlqueue.ConfigurationError, match="limit"):
        queue.workflows(limit=0)
    with pytest.raises(sqlqueue.ConfigurationError, match="before_id"):
        queue.workflows(before_id=-1)
    with pytest.raises(sqlqueue.ConfigurationError, match="workflow_id"):
        queue.workflow_summary(2**70)


def test_the_list_is_two_statements_whatever_the_number_of_workflows_and_reads_no_step_rows(
    backend: Backend,
) -> None:
    queue = order_queue(backend)
    for order in range(12):
        queue.enqueue_workflow(queue.engine, order_workflow(order, broken=True))
    drain(queue)  # twelve workflows held up by a dead step each

    with statements(queue.engine) as few:
        assert len(queue.workflows(limit=2)) == 2
    with statements(queue.engine) as many:
        listed = queue.workflows(limit=12)

    assert [summary.blocked_by for summary in listed] == [("notify",)] * 12
    reads = [sql for sql in many.sql if "sqlqueue_" in sql]
    assert len(reads) == len([sql for sql in few.sql if "sqlqueue_" in sql]) == 2
    # The steps and edges are read for the dead jobs only, joined in the second statement.
    assert "sqlqueue_workflow_steps" not in reads[0]
    assert "sqlqueue_workflow_edges" in reads[1]


# -- the pages ----------------------------------------------------------------------------------


def test_the_workflows_list_shows_counts_policy_the_steps_holding_each_up_and_whether_it_ended(
    backend: Backend,
) -> None:
    queue, handles = orders(backend)
    web = client(queue)

    html = web.get("/workflows").text

    assert '<a href="/workflows">Workflows</a>' in html  # in the navigation of every page
    assert _rows(html, "workflows", "workflow-id") == [
        str(handles[name].id) for name in ("cancelled", "held", "done")
    ]
    held = _row(html, "workflows", f'data-workflow-id="{handles["held"].id}"')
    assert '<span class="status status-dead" data-count="dead">1</span> dead' in held
    assert '<span class="status status-waiting" data-count="waiting">1</span> waiting' in held
    assert 'data-count="queued"' not in held  # only the statuses it has steps in
    assert '<span class="step-name held" title="notify">notify</span>' in held
    assert '<span class="muted">running</span>' in held
    assert "<code>wait</code>" in held
    done = _row(html, "workflows", f'data-workflow-id="{handles["done"].id}"')
    assert 'data-count="succeeded">4</span> succeeded</span></td>' in done
    assert '<span class="muted">running</span>' not in done
    assert '<svg class="bar"' in done
    assert "<code>cancel</code>" in _row(
        html, "workflows", f'data-workflow-id="{handles["cancelled"].id}"'
    )
    assert '<a href="/workflows">Workflows</a>' in web.get("/").text


def test_the_workflows_list_pages_on_and_says_when_there_is_none(backend: Backend) -> None:
    queue = order_queue(backend)
    web = client(queue)
    assert "No workflows yet" in web.get("/workflows").text
    ids = [queue.enqueue_workflow(queue.engine, order_workflow(n)).id for n in range(3)]

    first = web.get("/workflows").text
    older = web.get(f"/workflows?before_id={ids[1]}").text

    assert _rows(first, "workflows", "workflow-id") == [str(i) for i in reversed(ids)]
    assert _rows(older, "workflows", "workflow-id") == [str(ids[0])]
    assert '<a href="/workflows">« Newest</a>' in older
    assert web.get("/workflows?before_id=x").status_code == 400


def test_a_workflows_page_lists_its_steps_in_topological_order_with_job_attempts_and_error(
    backend: Backend,
) -> None:
    queue, handles = orders(backend)
    handle = handles["held"]
    web = client(queue)

    html = web.get(f"/workflows/{handle.id}").text

    assert f"Workflow #{handle.id}" in html
    assert '<span class="badge gone">held up</span>' in html
    assert '<code id="on-dead">wait</code>' in html
    assert "3 of 4 steps ended" in html
    assert _rows(html, "steps", "step") == ["charge", "notify", "receipt", "complete"]
    notify = _row(html, "steps", 'data-step="notify"')
    job_id = handle.job_ids["notify"]
    assert f'<a class="one-line" href="/jobs/{job_id}">#{job_id}</a>' in notify
    assert '<span class="status status-dead">dead</span>' in notify
    assert '<td class="num attempts">1/1</td>' in notify
    assert "warehouse webhook refused: 503" in notify
    assert '<td class="after">charge</td>' in notify
    assert 'aria-label="reason to requeue step notify"' in notify
    assert f'<tr data-step="notify" data-job-id="{job_id}" class="blocked">' in html
    complete = _row(html, "steps", 'data-step="complete"')
    assert '<td class="after">receipt, notify</td>' in complete or (
        '<td class="after">notify, receipt</td>' in complete
    )
    assert "requeue" not in complete  # only a dead step has the action
    held_up = html.split('id="blocked-by"', 1)[1].split("</section>", 1)[0]
    assert f'<a class="step-name held" href="/jobs/{job_id}">notify</a> (dead)' in held_up


def test_a_workflows_graph_draws_each_step_and_edge_with_the_blocked_step_marked(
    backend: Backend,
) -> None:
    queue, handles = orders(backend)
    web = client(queue)

    html = web.get(f"/workflows/{handles['held'].id}").text

    graph = html.split('id="graph"', 1)[1].split("</svg>", 1)[0]
    nodes = re.findall(
        r'<a href="/jobs/(\d+)" class="node node-(\w+)( blocked)?" data-step="(\w+)"', graph
    )
    assert {(step, status, bool(blocked)) for _, status, blocked, step in nodes} == {
        ("charge", "succeeded", False),
        ("notify", "dead", True),
        ("receipt", "succeeded", False),
        ("complete", "waiting", False),
    }
    edges = set(re.findall(r'data-from="(\w+)" data-to="(\w+)"', graph))
    assert edges == {
        ("charge", "notify"),
        ("charge", "receipt"),
        ("notify", "complete"),
        ("receipt", "complete"),
    }
    assert "style=" not in graph  # the Content-Security-Policy refuses inline styles


def test_a_big_workflow_pages_its_steps_and_is_not_drawn(backend: Backend) -> None:
    queue = order_queue(backend)
    wf = Workflow()
    wf.add("s0", JobRequest(job_type="mail.receipt", payload={"order": 0}))
    for n in range(1, 250):
        wf.add(
            f"s{n}", JobRequest(job_type="mail.receipt", payload={"order": n}), after=[f"s{n - 1}"]
        )
    handle = queue.enqueue_workflow(queue.engine, wf)
    web = client(queue)

    first = web.get(f"/workflows/{handle.id}").text
    second = web.get(f"/workflows/{handle.id}?start=200").text

    assert _rows(first, "steps", "step") == [f"s{n}" for n in range(200)]
    assert _rows(second, "steps", "step") == [f"s{n}" for n in range(200, 250)]
    assert 'id="graph"' not in first
    assert f'href="/workflows/{handle.id}?start=200">Later steps' in first
    assert f'<a href="/workflows/{handle.id}">« Earlier steps</a>' in second
    for start in ("250", "x", "-1", "9" * 12):
        assert web.get(f"/workflows/{handle.id}?start={start}").status_code == 400


def test_a_steps_job_page_links_its_workflow_page_and_a_batch_childs_its_batch(
    backend: Backend,
) -> None:
    queue, handles = orders(backend)
    handle = handles["held"]
    web = client(queue)

    html = web.get(f"/jobs/{handle.job_ids['receipt']}").text

    row = re.search(r'<tr id="workflow">(.*?)</tr>', html)
    assert row is not None
    assert f'<a href="/workflows/{handle.id}">#{handle.id}</a>: 3 of 4 steps ended' in row.group(1)
    assert "held up by notify" in row.group(1)
    assert 'id="batch"' not in html
    (batch_child,) = queue.jobs(job_type="mail.receipt", limit=50, status="succeeded")[:1]
    assert batch_child.batch_id is not None
    assert queue.workflow_summary(batch_child.batch_id) is None
    child_page = web.get(f"/jobs/{batch_child.id}").text
    assert f'<a href="/batches/{batch_child.batch_id}">' in child_page
    assert 'id="workflow"' not in child_page


def test_unknown_and_hostile_workflow_ids_are_404s(backend: Backend) -> None:
    queue, _ = orders(backend)
    with queue.engine.begin() as conn:
        batch = queue.enqueue_batch(
            conn, [JobRequest(job_type="mail.receipt", payload={"order": 1})]
        )
    web = client(queue)

    for path in (
        "/workflows/987654",
        f"/workflows/{batch.id}",  # a plain batch is no workflow
        "/workflows/0",
        f"/workflows/{2**63}",
        "/workflows/99999999999999999999999999",
        "/workflows/-1",
        "/workflows/abc",
        "/workflows/1%00",
        "/workflows/%3Cscript%3E",
    ):
        answer = web.get(path)
        assert answer.status_code == 404, path
        assert "<script>" not in answer.text


# -- requeue of a dead step ---------------------------------------------------------------------


def test_requeue_of_a_dead_step_from_the_workflow_page_takes_its_place_and_the_workflow_ends(
    backend: Backend,
) -> None:
    queue, handles = orders(backend)
    handle = handles["held"]
    dead = handle.job_ids["notify"]
    web = client(queue, current_user=lambda request: "ada")
    token = token_of(web.get(f"/workflows/{handle.id}").text)
    with queue.engine.begin() as conn:  # the operator fixed the cause
        conn.execute(
            sa.text("UPDATE sqlqueue_jobs SET payload = :payload WHERE id = :id"),
            {"payload": '{"order": 2, "broken": false}', "id": dead},
        )

    answer = web.post(
        f"/workflows/{handle.id}/requeue",
        data={"csrf_token": token, "job_id": str(dead), "reason": "warehouse is back"},
    )

    assert answer.status_code == 303
    old = queue.get_job(dead)
    assert old is not None
    assert old.requeued_as is not None
    assert answer.headers["location"] == f"/workflows/{handle.id}?requeued={old.requeued_as}"
    assert (old.requeued_by, old.requeue_reason) == ("ada", "warehouse is back")
    status = queue.get_workflow(handle.id)
    assert status is not None
    assert status.steps["notify"].job_id == old.requeued_as
    assert status.blocked_by == ()
    page = web.get(answer.headers["location"]).text
    assert f'Requeued as job <a href="/jobs/{old.requeued_as}">#{old.requeued_as}</a>' in page
    drain(queue)
    status = queue.get_workflow(handle.id)
    assert status is not None
    assert (status.succeeded, status.finished_at is not None) == (True, True)


def test_requeue_of_a_dead_step_of_a_finished_workflow_says_the_new_job_runs_on_its_own(
    backend: Backend,
) -> None:
    """A finished workflow stays as it finished: its page says the new job runs on its own,
    the step keeps its dead job, and its row shows what it was requeued as instead of a
    second Requeue form."""
    queue, handles = orders(backend)
    handle = handles["cancelled"]
    dead = handle.job_ids["notify"]
    before = queue.get_workflow(handle.id)
    web = client(queue, current_user=lambda request: "ada")
    token = token_of(web.get(f"/workflows/{handle.id}").text)

    answer = web.post(
        f"/workflows/{handle.id}/requeue",
        data={"csrf_token": token, "job_id": str(dead), "reason": "send it anyway"},
    )

    assert answer.status_code == 303
    old = queue.get_job(dead)
    assert old is not None
    assert old.requeued_as is not None
    assert queue.get_workflow(handle.id) == before
    page = web.get(answer.headers["location"]).text
    assert "the workflow had finished, so the new job runs on its own" in page
    row = _row(page, "steps", 'data-step="notify"')
    assert f'requeued as <a href="/jobs/{old.requeued_as}">#{old.requeued_as}</a>' in row
    assert "<form" not in row


def test_a_requeue_of_a_job_not_a_dead_step_of_that_workflow_is_refused_and_changes_nothing(
    backend: Backend,
) -> None:
    queue, handles = orders(backend)
    held, done = handles["held"], handles["done"]
    web = client(queue)
    token = token_of(web.get(f"/workflows/{held.id}").text)
    before = dead_snapshot(queue.engine)

    def post(workflow_id: int, job_id: object) -> Any:
        form = {"csrf_token": token, "job_id": str(job_id), "reason": "try"}
        return web.post(f"/workflows/{workflow_id}/requeue", data=form)

    other_dead = handles["cancelled"].job_ids["notify"]
    answers = {
        "another workflow's dead step": (post(held.id, other_dead), 404),
        "a succeeded step": (post(held.id, held.job_ids["charge"]), 409),
        "a waiting step": (post(held.id, held.job_ids["complete"]), 409),
        "no workflow": (post(987_654, held.job_ids["notify"]), 404),
        "a finished workflow's step": (post(done.id, held.job_ids["notify"]), 404),
        "not a number": (post(held.id, "1 OR 1=1"), 400),
        "a huge number": (post(held.id, 2**64), 400),
    }

    for what, (answer, expected) in answers.items():
        assert answer.status_code == expected, what
    no_reason = web.post(
        f"/workflows/{held.id}/requeue",
        data={"csrf_token": token, "job_id": str(held.job_ids["notify"]), "reason": " "},
    )
    assert no_reason.status_code == 400
    assert dead_snapshot(queue.engine) == before


def test_read_only_and_authorize_hide_and_refuse_the_requeue_and_guard_the_pages(
    backend: Backend,
) -> None:
    queue, handles = orders(backend)
    held = handles["held"]
    dead = held.job_ids["notify"]
    before = dead_snapshot(queue.engine)
    secret = "s" * 32  # one key: a token the writable page signed passes the others' check
    writable = client(queue, secret_key=secret)
    token = token_of(writable.get(f"/workflows/{held.id}").text)
    read_only = client(queue, read_only=True, secret_key=secret)
    no_requeue = client(
        queue, authorize=lambda request, action: action == "view", secret_key=secret
    )
    nobody = client(queue, authorize=lambda request, action: False)

    for web, refusal in ((read_only, "read-only"), (no_requeue, "you may not requeue")):
        html = web.get(f"/workflows/{held.id}").text
        assert "reason to requeue step" not in html
        assert 'id="steps"' in html
        web.cookies = writable.cookies
        answer = web.post(
            f"/workflows/{held.id}/requeue",
            data={"csrf_token": token, "job_id": str(dead), "reason": "x"},
        )
        assert answer.status_code == 403
        assert refusal in answer.text
    for path in ("/workflows", f"/workflows/{held.id}"):
        assert nobody.get(path).status_code == 403
    assert dead_snapshot(queue.engine) == before


def test_a_requeue_with_a_valid_token_but_no_permission_is_a_403(backend: Backend) -> None:
    queue, handles = orders(backend)
    held = handles["held"]
    allowed = {"view": True, "requeue": True}
    web = client(queue, authorize=lambda request, action: allowed.get(action, False))
    token = token_of(web.get(f"/workflows/{held.id}").text)
    allowed["requeue"] = False  # taken away after the page was served
    before = dead_snapshot(queue.engine)

    answer = web.post(
        f"/workflows/{held.id}/requeue",
        data={"csrf_token": token, "job_id": str(held.job_ids["notify"]), "reason": "x"},
    )

    assert answer.status_code == 403
    assert "you may not requeue here" in answer.text
    assert dead_snapshot(queue.engine) == before


def test_hostile_step_names_render_as_text_in_the_list_the_table_and_the_graph(
    backend: Backend,
) -> None:
    queue = order_queue(backend)
    hostile = "<img src=x onerror=alert(1)>\"'&"
    wf = Workflow()
    wf.add(hostile, JobRequest(job_type="warehouse.notify", payload={"order": 1, "broken": True}))
    wf.add("after it", JobRequest(job_type="mail.receipt", payload={"order": 1}), after=[hostile])
    handle = queue.enqueue_workflow(queue.engine, wf)
    drain(queue)
    summary = queue.workflow_summary(handle.id)
    assert summary is not None
    assert summary.blocked_by == (hostile,)
    web = client(queue)

    pages = [web.get("/workflows").text, web.get(f"/workflows/{handle.id}").text]
    pages.append(web.get(f"/jobs/{handle.job_ids['after it']}").text)

    for html in pages:
        assert "<img" not in html
        assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert 'data-step="&lt;img src=x onerror=alert(1)&gt;&#34;&#39;&amp;"' in pages[1]
