"""A worker's round trip (``Store.cycle``): finished attempts' outcomes and the next claims in one
transaction, on every backend."""

from __future__ import annotations

from sqlqueue._store.rows import Failure


def _queue_with_jobs(backend):
    queue = backend.queue(lease_seconds=30)

    @queue.task("work")
    def work() -> None:
        pass

    with backend.engine.begin() as conn:
        grouped = [work.options(group_key="g").enqueue(conn) for _ in range(2)]
        plain = [work.enqueue(conn) for _ in range(3)]
    return queue, grouped, plain


def _cycle(queue, worker_id, *, succeeded=(), failures=(), limit=10):
    return queue.store.cycle(
        worker_id=worker_id,
        succeeded=list(succeeded),
        failures=list(failures),
        results=None,
        claims=[(("default",), limit)],
        job_types=None,
        lease_seconds=30,
    )


def test_a_cycle_claims_up_to_its_limit_most_urgent_first(backend):
    queue, grouped, plain = _queue_with_jobs(backend)
    landed, [claimed] = _cycle(queue, "w1", limit=3)
    assert landed == set()
    assert [job.id for job in claimed] == [grouped[0], *plain[:2]]  # the group's second waits
    assert {queue.get_job(job.id).locked_by for job in claimed} == {"w1"}


def test_outcomes_land_first_so_a_finished_group_job_frees_the_next_in_the_same_cycle(backend):
    queue, grouped, _plain = _queue_with_jobs(backend)
    _, [first] = _cycle(queue, "w1")
    assert grouped[1] not in {job.id for job in first}
    done = next(job for job in first if job.id == grouped[0])
    landed, [second] = _cycle(queue, "w1", succeeded=[done.fence])
    assert landed == {grouped[0]}
    assert [job.id for job in second] == [grouped[1]]
    assert queue.get_job(grouped[0]).status == "succeeded"


def test_a_stale_outcome_does_not_land_and_does_not_stop_the_claims(backend):
    queue, _grouped, plain = _queue_with_jobs(backend)
    _, [claimed] = _cycle(queue, "w1", limit=1)
    job = claimed[0]
    failure = Failure(
        job_id=job.id,
        attempt=job.attempt,
        dead=False,
        retry_in=60.0,
        last_error="boom",
        errors=[],
    )
    landed, [more] = _cycle(queue, "w2", succeeded=[(plain[0], 1)], failures=[failure], limit=2)
    assert landed == set()  # neither lease belongs to w2 (plain[0] is not even claimed)
    assert [j.id for j in more] == plain[:2]
    assert queue.get_job(job.id).status == "running"  # w1's lease is untouched
    landed, _ = _cycle(queue, "w1", failures=[failure], limit=0)
    assert landed == {job.id}
    assert queue.get_job(job.id).status == "failed"
