"""Job tags on every backend: on a task and an enqueue, ``queue.jobs(tag=…)``, ``--tag`` in
the CLI's job list, tags in ``jobs show``; bad tags refused before any SQL."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

import sqlqueue
from sqlqueue._tags import MAX_TAGS, check_tags
from tests._support import count_jobs, drain, run_cli


def _queue(backend):
    queue = backend.queue()

    @queue.task("import_rows", tags=["import"])
    def import_rows(n: int) -> None:
        pass

    return queue, import_rows


def test_jobs_filter_by_tag_of_the_job_and_of_its_task(backend):
    queue, import_rows = _queue(backend)
    with queue.engine.begin() as conn:
        a = import_rows.options(tags=["tenant:42"]).enqueue(conn, n=1)
        b = import_rows.options(tags=["tenant:7"]).enqueue(conn, n=2)
        c, d = queue.enqueue_many(
            conn,
            [
                sqlqueue.JobRequest(job_type="import_rows", payload={"n": 3}, tags=["tenant:42"]),
                sqlqueue.JobRequest(job_type="import_rows", payload={"n": 4}),
            ],
        )
    assert [job.id for job in queue.jobs(tag="tenant:42")] == [c, a]
    assert [job.id for job in queue.jobs(tag="tenant:7")] == [b]
    assert [job.id for job in queue.jobs(tag="import")] == [d, c, b, a]
    assert queue.jobs(tag="tenant:4") == []
    assert queue.jobs(tag="tenant:42", status="succeeded") == []
    job = queue.get_job(a)
    assert job is not None
    assert job.tags == ("import", "tenant:42")


def test_listed_jobs_carry_their_tags_like_a_job_read_alone(backend):
    queue, import_rows = _queue(backend)
    with queue.engine.begin() as conn:
        a = import_rows.options(tags=["tenant:42", "big"]).enqueue(conn, n=1)
        b = import_rows.enqueue(conn, n=2)
    listed = {job.id: job.tags for job in queue.jobs()}
    assert listed == {a: ("big", "import", "tenant:42"), b: ("import",)}
    assert listed[a] == queue.get_job(a).tags


def test_a_requeued_dead_job_keeps_its_tags(backend):
    queue = backend.queue()

    @queue.task("fragile", tags=["import"], max_attempts=1)
    def fragile(n: int) -> None:
        raise ValueError("bad row")

    with queue.engine.begin() as conn:
        dead = fragile.options(tags=["tenant:42"]).enqueue(conn, n=1)
        other = fragile.enqueue(conn, n=2)
    drain(queue)
    again = queue.requeue(dead, by="ops", reason="fixed the row")
    [moved] = queue.requeue_where(job_ids=[other], by="ops", reason="fixed too")
    assert queue.get_job(again).tags == ("import", "tenant:42")
    assert queue.get_job(moved).tags == ("import",)
    assert [job.id for job in queue.jobs(tag="tenant:42", status="queued")] == [again]


def test_tags_go_with_pruned_jobs_and_stay_with_running_ones(backend):
    queue, import_rows = _queue(backend)
    with queue.engine.begin() as conn:
        import_rows.options(tags=["t"]).enqueue(conn, n=1)
    drain(queue)
    assert [job.status for job in queue.jobs(tag="t")] == ["succeeded"]
    queue.prune(older_than=0)
    assert queue.jobs(tag="t") == []
    assert count_jobs(backend.engine) == 0


def test_cli_lists_jobs_by_tag_and_shows_them(backend):
    queue, import_rows = _queue(backend)
    with queue.engine.begin() as conn:
        tagged = import_rows.options(tags=["tenant:42"]).enqueue(conn, n=1)
        import_rows.enqueue(conn, n=2)
    listed = run_cli("jobs", "list", "--tag", "tenant:42", "--json", url=backend.url)
    assert listed.returncode == 0, listed.stderr
    assert [job["id"] for job in json.loads(listed.stdout)] == [tagged]
    shown = run_cli("jobs", "show", str(tagged), url=backend.url)
    assert shown.returncode == 0, shown.stderr
    assert "tags:             import, tenant:42" in shown.stdout


@pytest.mark.parametrize(
    ("tags", "message"),
    [
        ("tenant:42", "tags must be a list of strings"),
        ([42], r"tags\[0\] must be a string"),
        ([""], r"tags\[0\] must not be empty"),
        (["x" * 101], r"tags\[0\] is 101 characters long"),
        ([" padded"], "surrounding whitespace"),
        (["a\x00b"], "NUL"),
        ([f"t{i}" for i in range(MAX_TAGS)], f"at most {MAX_TAGS} tags"),  # + the task's
    ],
)
def test_bad_tags_are_refused_before_any_sql(backend, tags, message):
    queue, _ = _queue(backend)
    with queue.engine.begin() as conn, pytest.raises(sqlqueue.EnqueueError, match=message):
        queue.enqueue(conn, "import_rows", {"n": 1}, tags=tags)
    assert count_jobs(backend.engine) == 0
    with pytest.raises(sqlqueue.ConfigurationError, match="tag"):
        queue.jobs(tag=" padded")


def test_bad_task_tags_are_refused_at_declaration(tmp_path):
    queue = sqlqueue.Queue(f"sqlite:///{tmp_path / 'jobs.db'}")
    with pytest.raises(sqlqueue.ConfigurationError, match="tags must be a list of strings"):
        queue.task("t", tags="import")(lambda: None)


tag_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1).filter(
    lambda t: t == t.strip() and len(t) <= 100
)


@given(tags=st.lists(tag_text, max_size=MAX_TAGS))
def test_any_valid_tags_are_kept_in_order_without_repeats(tags):
    assert check_tags(tags, sqlqueue.EnqueueError) == tuple(dict.fromkeys(tags))


@given(value=st.one_of(st.text(), st.integers(), st.lists(st.integers(), min_size=1)))
def test_anything_but_a_list_of_tags_is_refused(value):
    with pytest.raises(sqlqueue.EnqueueError):
        check_tags(value, sqlqueue.EnqueueError)


def test_web_job_list_filters_by_tag_and_the_job_page_shows_tags(backend):
    pytest.importorskip("starlette")
    from sqlqueue.web import create_app
    from tests._support.web import browser_client, token_of

    queue, import_rows = _queue(backend)
    with queue.engine.begin() as conn:
        tagged = import_rows.options(tags=["tenant:42"], expires_in=3600).enqueue(conn, n=1)
        other = import_rows.enqueue(conn, n=2)
    web = browser_client(create_app(queue))

    page = web.get("/jobs?tag=tenant:42")
    assert page.status_code == 200, page.text
    listed = {int(part.split('"')[0]) for part in page.text.split('data-job-id="')[1:]}
    assert listed == {tagged}
    assert 'name="tag" value="tenant:42"' in page.text
    everything = web.get("/jobs?tag=import").text
    assert {int(p.split('"')[0]) for p in everything.split('data-job-id="')[1:]} == {
        tagged,
        other,
    }
    job_page = web.get(f"/jobs/{tagged}")
    assert job_page.status_code == 200
    assert '<tr id="tags">' in job_page.text
    assert "<code>tenant:42</code>" in job_page.text
    assert "expires" in job_page.text

    bad = web.get("/jobs?tag=" + "x" * 101)
    assert bad.status_code == 400
    assert "tag is 101 characters long" in bad.text
    token = token_of(page.text)
    for path in ("/jobs/bulk", "/jobs/bulk/confirm", "/jobs/discard"):
        refused = web.post(
            path,
            data={
                "csrf_token": token,
                "action": "cancel",
                "scope": "matching",
                "type": "import_rows",
                "tag": "tenant:42",
                "reason": "r",
            },
        )
        assert refused.status_code == 400, path
        assert "with a tag filter" in refused.text
    assert queue.get_job(other).status == "queued"
