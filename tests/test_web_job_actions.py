"""The web page's actions on waiting jobs (cancel, retry now, reschedule) and its bulk actions
over HTTP, against each backend's real database: each refuses without the CSRF token, from
another origin, on a read-only page or when ``authorize`` says no — and changes nothing; the
reschedule time and the bulk filter take arbitrary text (Hypothesis) and answer with the
change or a 400 that says what is wrong, never a crash; a bulk confirmation states exactly the
count of jobs its filter matches. The browser drives the same actions in
``test_web_browser_pages.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import example, given
from hypothesis import strategies as st

import sqlqueue
from sqlqueue._operators.moments import parse_run_time
from sqlqueue.web import create_app
from tests._support import drain, enqueue
from tests._support.web import browser_client, populated, token_of
from tests.conftest import Backend


def _job(queue: sqlqueue.Queue, job_id: int) -> sqlqueue.Job:
    """Job ``job_id``, which the test knows is there."""
    job = queue.get_job(job_id)
    assert job is not None, job_id
    return job


Ids = dict[str, list[int]]


def snapshot(engine: sa.Engine) -> list[tuple[Any, ...]]:
    """Every job's state, run time and dead-letter marks, and every recorded action: what no
    refused request may change."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT id, status, next_run_at, cancel_requested_at, requeued_as, discarded_at "
                "FROM sqlqueue_jobs ORDER BY id"
            )
        ).all()
        actions = conn.execute(sa.text("SELECT count(*) FROM sqlqueue_job_actions")).scalar()
    return [tuple(row) for row in rows] + [("actions", actions)]


#: Each new action: what ``authorize`` is asked, the POST, and its form.
NEW_ACTIONS: list[tuple[str, Callable[[Ids], str], dict[str, Any]]] = [
    ("cancel", lambda ids: f"/jobs/{ids['queued'][0]}/cancel", {"reason": "r"}),
    ("retry", lambda ids: f"/jobs/{ids['failed'][0]}/retry", {"reason": "r"}),
    (
        "reschedule",
        lambda ids: f"/jobs/{ids['queued'][0]}/reschedule",
        {"reason": "r", "run_at": "+1h"},
    ),
    (
        "cancel",
        lambda ids: "/jobs/bulk/confirm",
        {"reason": "r", "action": "cancel", "scope": "matching", "type": "mail.send"},
    ),
    (
        "requeue",
        lambda ids: "/jobs/bulk/confirm",
        {"reason": "r", "action": "requeue", "scope": "matching", "error": "503"},
    ),
    (
        "discard",
        lambda ids: "/jobs/bulk/confirm",
        {"reason": "r", "action": "discard", "scope": "matching", "error": "503"},
    ),
]
NEW_IDS = ["cancel", "retry", "reschedule", "bulk-cancel", "bulk-requeue", "bulk-discard"]


@pytest.fixture
def jobs(backend: Backend) -> tuple[sqlqueue.Queue, Ids]:
    """The shared populated queue: queued mail, a failed flaky job, dead crm jobs."""
    return populated(backend)


@pytest.mark.parametrize(("action", "path", "form"), NEW_ACTIONS, ids=NEW_IDS)
def test_every_new_action_refuses_without_token_from_elsewhere_read_only_or_unauthorized(
    backend: Backend, jobs: Any, action: str, path: Any, form: dict[str, Any]
) -> None:
    queue, ids = jobs
    before = snapshot(backend.engine)
    web = browser_client(create_app(queue))
    token = token_of(web.get(f"/jobs/{ids['queued'][0]}").text)
    read_only = browser_client(create_app(queue, read_only=True))
    read_only.cookies.update(web.cookies)
    refused = browser_client(create_app(queue, authorize=lambda request, asked: asked != action))
    refused.cookies.update(web.cookies)
    elsewhere = web.post(
        path(ids), data={**form, "csrf_token": token}, headers={"Origin": "http://evil.test"}
    )

    answers = {
        "no token": web.post(path(ids), data=form),
        "elsewhere": elsewhere,
        "read only": read_only.post(path(ids), data={**form, "csrf_token": token}),
        "unauthorized": refused.post(path(ids), data={**form, "csrf_token": token}),
    }

    assert {name: answer.status_code for name, answer in answers.items()} == dict.fromkeys(
        answers, 403
    )
    assert "security token" in answers["no token"].text
    assert "not from this page" in answers["elsewhere"].text
    assert "read-only" in answers["read only"].text
    assert f"you may not {action} here" in answers["unauthorized"].text
    assert snapshot(backend.engine) == before
    # and the page shows none of the buttons the host refused
    job_page = refused.get(f"/jobs/{ids['queued'][0]}").text
    shown = {
        "cancel": 'class="cancel"' in job_page,
        "retry": "Retry now</button>" in job_page,
        "reschedule": "Reschedule</button>" in job_page,
        "requeue": 'value="requeue"' in refused.get("/jobs?error=503").text,
        "discard": 'value="discard"' in refused.get("/jobs?error=503").text,
    }
    assert not shown[action]
    assert sum(shown.values()) == len(shown) - 1


def test_read_only_pages_show_no_action_on_a_waiting_job_or_the_list(
    backend: Backend, jobs: Any
) -> None:
    queue, ids = jobs
    web = browser_client(create_app(queue, read_only=True))
    pages = [
        web.get(path).text
        for path in (f"/jobs/{ids['queued'][0]}", f"/jobs/{ids['failed'][0]}", "/jobs?type=flaky")
    ]
    assert all('method="post"' not in page for page in pages)
    assert all('name="job_id"' not in page for page in pages)


def test_the_job_actions_change_the_job_and_record_who_and_why(backend: Backend, jobs: Any) -> None:
    queue, ids = jobs
    web = browser_client(create_app(queue, current_user=lambda request: "ada"))
    queued, failed, other = ids["queued"][0], ids["failed"][0], ids["queued"][1]
    token = token_of(web.get(f"/jobs/{queued}").text)

    moved = web.post(
        f"/jobs/{queued}/reschedule",
        data={"csrf_token": token, "run_at": "2999-01-02T03:04:05+01:00", "reason": "after"},
    )
    retried = web.post(f"/jobs/{failed}/retry", data={"csrf_token": token, "reason": "fixed"})
    cancelled = web.post(f"/jobs/{other}/cancel", data={"csrf_token": token, "reason": "dup"})

    assert [moved.status_code, retried.status_code, cancelled.status_code] == [303] * 3
    assert retried.headers["location"] == f"/jobs/{failed}?retried=1"
    rescheduled = _job(queue, queued)
    assert rescheduled is not None
    assert rescheduled.next_run_at == datetime(2999, 1, 2, 2, 4, 5, tzinfo=UTC)
    due = _job(queue, failed)
    assert due is not None
    assert due.next_run_at <= queue.database_now()
    assert due.attempts == 1  # the same retry, made due early
    gone = _job(queue, other)
    assert gone is not None
    assert gone.status is sqlqueue.JobStatus.CANCELLED
    recorded = {
        job_id: [(a.action, a.by, a.reason, dict(a.detail)) for a in queue.job_actions(job_id)]
        for job_id in (queued, failed, other)
    }
    assert recorded == {
        queued: [("reschedule", "ada", "after", {"run_at": "2999-01-02T02:04:05+00:00"})],
        failed: [("run_now", "ada", "fixed", {})],
        other: [("cancel", "ada", "dup", {})],
    }
    page = web.get(f"/jobs/{queued}").text
    assert 'id="history"' in page
    assert "rescheduled to 2999-01-02T02:04:05+00:00" in page
    # Retry now on a job already due does nothing, and says so.
    again = web.post(f"/jobs/{failed}/retry", data={"csrf_token": token, "reason": "again"})
    assert again.headers["location"] == f"/jobs/{failed}?retried=0"
    assert "was due already" in web.get(again.headers["location"]).text
    # A finished job cannot be rescheduled: a 409 that says why.
    late = web.post(
        f"/jobs/{other}/reschedule", data={"csrf_token": token, "run_at": "+1h", "reason": "x"}
    )
    assert late.status_code == 409
    assert "only queued or failed jobs can be rescheduled" in late.text


NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@given(text=st.one_of(st.text(max_size=40), st.from_regex(r"(\+|in )?[0-9 .]{0,8}[smhdw]?")))
@example("+30m")
@example("in 2h")
@example("2026-12-01T18:00:00Z")
@example("2026-12-01T11:59:30")
@example("2026-12-01T11:58:00")
@example("9999-12-31T23:59:59-01:00")
@example("+99999999w")
@example("0001-01-01T00:00:00+14:00")
def test_a_typed_run_time_is_a_future_time_or_a_clear_error(text: str) -> None:
    problem: str | None = None
    try:
        moment = parse_run_time(text, now=NOW)
    except sqlqueue.ConfigurationError as error:
        problem = str(error)
    if problem is not None:
        assert problem.startswith("run at: ")
        return
    assert moment.tzinfo is not None
    assert moment >= NOW - timedelta(seconds=60)
    assert moment.year <= 9999


@given(text=st.text(max_size=30))
@example("+10m")
@example("2000-01-01")
@example("\x00")
def test_reschedule_over_http_moves_the_job_or_answers_400(
    backend: Backend, jobs: Any, text: str
) -> None:
    queue, ids = jobs
    job_id = ids["queued"][0]
    web = browser_client(create_app(queue))
    token = token_of(web.get(f"/jobs/{job_id}").text)
    before = _job(queue, job_id)
    assert before is not None

    answer = web.post(
        f"/jobs/{job_id}/reschedule", data={"csrf_token": token, "run_at": text, "reason": "p"}
    )

    after = _job(queue, job_id)
    assert after is not None
    if answer.status_code == 303:
        assert after.next_run_at > queue.database_now() - timedelta(seconds=120)
    else:
        assert answer.status_code == 400, answer.text
        assert after.next_run_at == before.next_run_at


#: Error text a filter has to escape in LIKE: ``%``, ``_``, quotes, a backslash, non-ASCII.
AWKWARD_ERROR = "50% of_it 'quoted' \\ ünï"


@pytest.fixture
def awkward(backend: Backend) -> sqlqueue.Queue:
    """Queued jobs of types that look alike to a careless filter (``mail.send``, ``mail_send``,
    ``mail%send``), and failed ones waiting for a retry whose error holds
    :data:`AWKWARD_ERROR` — one set for every example of a property."""
    queue = backend.queue()
    names = ["mail.send", "mail_send", "mail%send", "ünï'code\\"]
    for name in names:
        queue.task(name, queue=name[:4])(lambda n=0: None)

    @queue.task("flaky%", queue="mail", max_attempts=3, backoff=[3600])
    def flaky(n: int = 0) -> None:
        raise ValueError(AWKWARD_ERROR)

    enqueue(queue, "flaky%", 3)
    drain(queue)
    for index, name in enumerate(names):
        enqueue(queue, name, 2 + index)
    return queue


FRAGMENTS = ["", "50%", "of_it", "'quoted'", "\\", "ünï", "Value", "%_", "0% o"]


@given(
    job_type=st.sampled_from(["", "mail.send", "mail_send", "mail%send", "ünï'code\\", "flaky%"]),
    queue_name=st.sampled_from(["", "mail", "ünï'", "%"]),
    error=st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=4)),
    since=st.sampled_from(["", "1h", "2d", "2000-01-01", "soon", "1999-13-01"]),
    status=st.sampled_from(["", "queued", "failed", "dead"]),
)
def test_a_bulk_confirmation_states_exactly_the_jobs_its_filter_matches(
    awkward: sqlqueue.Queue, job_type: str, queue_name: str, error: str, since: str, status: str
) -> None:
    queue = awkward
    web = browser_client(create_app(queue))
    token = token_of(web.get("/jobs").text)
    form = {"type": job_type, "queue": queue_name, "error": error, "since": since}
    form.update(status=status, csrf_token=token, action="cancel", scope="matching")

    answer = web.post("/jobs/bulk", data=form)

    if answer.status_code == 400:
        narrowed = any(value.strip() for value in (job_type, queue_name, error, since))
        assert (not narrowed) or "since" in answer.text or "NUL" in answer.text, answer.text
        return
    assert answer.status_code == 200, answer.text
    wanted = error.strip()
    expected = [  # every job here changed seconds ago: each since above keeps them all
        job
        for job in queue.jobs(limit=10_000)
        if job.status.value in ((status,) if status else ("queued", "failed", "waiting"))
        and job.status.value in ("queued", "failed", "waiting")
        and (not job_type.strip() or job.job_type == job_type.strip())
        and (not queue_name.strip() or job.queue == queue_name.strip())
        and (not wanted or (job.last_error is not None and wanted in job.last_error))
    ]
    stated = int(answer.text.split('data-count="', 1)[1].split('"', 1)[0])
    assert stated == len(expected)


def test_bulk_cancel_of_ticked_jobs_and_of_every_match_records_who_and_why(
    backend: Backend, jobs: Any
) -> None:
    queue, ids = jobs
    web = browser_client(create_app(queue, current_user=lambda request: "grace"))
    token = token_of(web.get("/jobs").text)
    ticked = {"csrf_token": token, "action": "cancel", "scope": "selected"}

    confirm = web.post("/jobs/bulk", data={**ticked, "job_id": [str(i) for i in ids["queued"]]})
    assert confirm.status_code == 200
    assert "Cancel 2 jobs?" in confirm.text
    done = web.post(
        "/jobs/bulk/confirm",
        data={**ticked, "job_id": [str(i) for i in ids["queued"]], "reason": "not needed"},
    )

    assert done.status_code == 303
    assert "cancelled=2" in done.headers["location"]
    for job_id in ids["queued"]:
        job = _job(queue, job_id)
        assert job is not None
        assert job.status is sqlqueue.JobStatus.CANCELLED
        assert [(a.action, a.by, a.reason) for a in queue.job_actions(job_id)] == [
            ("cancel", "grace", "not needed")
        ]
    untouched = _job(queue, ids["failed"][0])
    assert untouched is not None
    assert untouched.status is sqlqueue.JobStatus.FAILED


def test_a_bulk_cancel_counts_the_waiting_workflow_step_it_will_cancel(backend: Backend) -> None:
    """The confirmation said "Cancel 1 job?" and the action cancelled 2: a workflow's
    ``waiting`` step matched the filter, and a cancel takes those too."""
    queue = backend.queue()
    queue.task("report.build", queue="reports")(lambda n=0: None)
    with backend.engine.begin() as conn:
        alone = queue.enqueue(conn, "report.build", {"n": 0})
        workflow = sqlqueue.Workflow()
        first = workflow.add("first", sqlqueue.JobRequest(job_type="report.build"))
        workflow.add("then", sqlqueue.JobRequest(job_type="report.build"), after=[first])
        handle = queue.enqueue_workflow(conn, workflow)
    waiting = handle.job_ids["then"]
    assert _job(queue, waiting).status is sqlqueue.JobStatus.WAITING
    web = browser_client(create_app(queue, current_user=lambda request: "grace"))
    form = {"csrf_token": token_of(web.get("/jobs").text), "action": "cancel"}
    form.update(scope="matching", type="report.build")

    confirm = web.post("/jobs/bulk", data=form)
    done = web.post("/jobs/bulk/confirm", data={**form, "reason": "report withdrawn"})

    assert confirm.status_code == 200, confirm.text
    assert "Cancel 3 jobs?" in confirm.text
    assert done.status_code == 303
    assert "cancelled=3" in done.headers["location"]
    for job_id in (alone, *handle.job_ids.values()):
        assert _job(queue, job_id).status is sqlqueue.JobStatus.CANCELLED


def test_a_bulk_cancel_of_a_list_filtered_to_failed_leaves_its_queued_jobs(
    backend: Backend, jobs: Any
) -> None:
    """The list shows failed jobs only: the action takes those, and counts them right; the
    queued jobs of the same queue, hidden by the filter, are untouched."""
    queue, ids = jobs
    failed = _job(queue, ids["failed"][0])
    web = browser_client(create_app(queue))
    form = {"csrf_token": token_of(web.get("/jobs").text), "action": "cancel"}
    form.update(scope="matching", status="failed", type=failed.job_type)

    confirm = web.post("/jobs/bulk", data=form)
    done = web.post("/jobs/bulk/confirm", data={**form, "reason": "gave up"})

    assert f"Cancel {len(ids['failed'])} job" in confirm.text
    assert f"cancelled={len(ids['failed'])}" in done.headers["location"]
    for job_id in ids["failed"]:
        assert _job(queue, job_id).status is sqlqueue.JobStatus.CANCELLED
    for job_id in ids["queued"]:
        assert _job(queue, job_id).status is sqlqueue.JobStatus.QUEUED


@pytest.mark.parametrize(
    ("form", "message"),
    [
        ({"action": "delete", "scope": "selected", "job_id": "1"}, "action must be"),
        ({"action": "cancel", "scope": "some", "type": "x"}, "scope must be"),
        ({"action": "cancel", "scope": "selected"}, "no job is ticked"),
        ({"action": "cancel", "scope": "selected", "job_id": "1x"}, "job_id must be a job id"),
        ({"action": "cancel", "scope": "matching"}, "refusing to cancel every job"),
        ({"action": "requeue", "scope": "matching", "status": "dead"}, "refusing to requeue"),
        ({"action": "cancel", "scope": "matching", "since": "soon"}, "since"),
    ],
)
def test_a_bulk_form_that_makes_no_sense_is_a_400_that_says_why(
    backend: Backend, jobs: Any, form: dict[str, str], message: str
) -> None:
    queue, _ = jobs
    web = browser_client(create_app(queue))
    token = token_of(web.get("/jobs").text)
    before = snapshot(backend.engine)

    answers = [
        web.post(path, data={**form, "csrf_token": token, "reason": "r"})
        for path in ("/jobs/bulk", "/jobs/bulk/confirm")
    ]

    assert [answer.status_code for answer in answers] == [400, 400]
    assert all(message in answer.text for answer in answers)
    assert snapshot(backend.engine) == before
