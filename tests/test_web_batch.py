"""The web page's job page shows the job's batch: its id and counts (issue 13), on every
backend, through the ASGI app itself as in ``test_web.py``."""

from __future__ import annotations

import re

import sqlqueue
from tests._support import drain
from tests.conftest import Backend
from tests.test_web import client


def _batch_row(html: str) -> str:
    match = re.search(r'<tr id="batch">(.*?)</tr>', html)
    assert match is not None, "the job page has no batch row"
    return match.group(1)


def test_a_jobs_page_shows_its_batch_counts_and_callback(backend: Backend) -> None:
    queue = backend.queue()

    @queue.task("part", max_attempts=1)
    def part(fail: bool = False) -> None:
        if fail:
            raise ValueError("part fails")

    @queue.task("parts_done", queue="callbacks")
    def parts_done() -> None:
        pass

    @queue.task("alone")
    def alone() -> None:
        pass

    requests = [sqlqueue.JobRequest(job_type="part", payload={"fail": n == 2}) for n in range(3)]
    with queue.engine.begin() as conn:
        batch = queue.enqueue_batch(
            conn, requests, on_complete=sqlqueue.JobRequest(job_type="parts_done")
        )
        plain = queue.enqueue(conn, "alone", {})
    web = client(queue)

    running = _batch_row(web.get(f"/jobs/{batch.job_ids[0]}").text)
    assert f"#{batch.id}</a>: 0 of 3 ended (0 succeeded, 0 dead, 0 cancelled)" in running
    assert "finished" not in running

    drain(queue, queues=["default"])
    status = queue.get_batch(batch.id)
    assert status is not None
    assert status.callback_job_id is not None
    callback = status.callback_job_id
    for job_id in (batch.job_ids[0], callback):  # a child, and the callback it completes
        row = _batch_row(web.get(f"/jobs/{job_id}").text)
        assert f"#{batch.id}</a>: 3 of 3 ended (2 succeeded, 1 dead, 0 cancelled), finished " in row
        assert f'callback <a href="/jobs/{callback}">#{callback}</a>' in row

    assert 'id="batch"' not in web.get(f"/jobs/{plain}").text
