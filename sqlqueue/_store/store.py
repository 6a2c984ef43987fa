"""The store: the worker's side of the database, one short transaction per operation, with
driver errors translated (the operators' side is :class:`~sqlqueue._store.admin.Admin`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, select

from sqlqueue._batch import BatchStatus
from sqlqueue._job import Job
from sqlqueue._schema import jobs
from sqlqueue._store import (
    batches,
    cancel,
    claim,
    deadletter,
    floor_probe,
    leases,
    outcomes,
    settled_completion,
    workers,
    workflow_reads,
)
from sqlqueue._store.claim_floor import ClaimFloors
from sqlqueue._store.gates import GateTransactions
from sqlqueue._store.job_actions import Record
from sqlqueue._store.limited_claim import ClaimLimits, claim_within_limits
from sqlqueue._store.rows import ClaimedJob, Failure
from sqlqueue._store.transactions import in_read, in_write
from sqlqueue._workflow import WorkflowStatus
from sqlqueue.dialects import Dialect

__all__ = ["Store"]

T = TypeVar("T")


class Store(GateTransactions):
    """sqlqueue's operations on one engine for workers and the queue's face (claims, outcomes,
    leases, gates, reads of one job); each method is one short transaction."""

    def __init__(self, engine: Engine, dialect: Dialect) -> None:
        self.engine = engine
        self.dialect = dialect
        #: Where each worker's claims start (``claim_floor.py``).
        self.claim_floors = ClaimFloors()

    def _in_write(self, operation: Callable[[Connection], T], *, relaxed: bool = False) -> T:
        """See :func:`in_write`: relaxed for claims, outcomes and heartbeats."""
        return in_write(self.engine, self.dialect, operation, relaxed=relaxed)

    def claim(
        self,
        *,
        queues: Sequence[str],
        job_types: Sequence[str] | None,
        limit: int,
        worker_id: str,
        lease_seconds: float,
        limits: ClaimLimits | None = None,
        now: datetime | None = None,
    ) -> list[ClaimedJob]:
        """Lease up to ``limit`` due jobs (see :func:`claim.claim`): a :meth:`cycle` with
        no outcomes to write."""
        _, [claimed] = self.cycle(
            worker_id=worker_id,
            succeeded=(),
            failures=(),
            results=None,
            claims=[(queues, limit)],
            job_types=job_types,
            lease_seconds=lease_seconds,
            limits=limits,
            now=now,
        )
        return claimed

    def probe_claim_floors(self) -> int:
        """Look before every claim floor for a job a claim without it would take, and lower the
        floors that have one (see ``floor_probe.py``): a read, for a worker's probe thread, on
        a pooled connection (the database thread's own when it is idle, else one more). How
        many floors went down (none, and no connection taken, without a floor)."""
        if not self.claim_floors.floors():
            return 0

        return in_read(
            self.engine,
            self.dialect,
            lambda conn: floor_probe.probe_floors(conn, self.dialect, self.claim_floors),
        )

    def cycle(
        self,
        *,
        worker_id: str,
        succeeded: Sequence[tuple[int, int]],
        failures: Sequence[Failure],
        results: Mapping[int, Any] | None,
        claims: Sequence[tuple[Sequence[str], int]],
        job_types: Sequence[str] | None,
        lease_seconds: float,
        ahead: Sequence[bool] = (),
        started: Sequence[tuple[int, int]] = (),
        limits: ClaimLimits | None = None,
        now: datetime | None = None,
        standby: Sequence[tuple[Sequence[str], int]] = (),
        batch_ids: Sequence[int] | None = None,
    ) -> tuple[set[int], list[list[ClaimedJob]]]:
        """A worker's round trip: write finished attempts' outcomes, then lease up to ``n``
        jobs for each ``(queues, n)`` of ``claims``, all in one transaction (one commit where
        there were two). Returns the ids whose outcome landed and the jobs of each claim,
        then of each ``standby`` claim: those claim only if the outcomes made jobs claimable
        in one of their queues (released workflow steps, a batch's callback), so a pool that
        rests claims what the round released in that round, and sends nothing otherwise.

        Outcomes go first, so a finished job of a group frees its group's next job for the
        claims of the same transaction. A claim whose ``ahead`` entry is true holds its jobs
        for slots not yet free (no ``started_at``); ``started`` records the starts of such jobs
        (see :func:`outcomes.record_starts`).

        ``limits`` are the concurrency limits the claims obey (the worker's tasks' and the
        queues' it read, see ``limited_claim.py``); without them a claim leases only jobs with
        no limit key, so a job under a limit is never run beyond it, only left for a worker
        that knows its limit.

        ``batch_ids``: the batches the ``succeeded`` jobs were claimed with, where the caller
        knows them (see :meth:`finish`)."""

        def claim_(
            conn: Connection, queues: Sequence[str], limit: int, ahead_: bool
        ) -> list[ClaimedJob]:
            """One claim: under ``limits`` where any applies, else the plain claim."""
            if limits is not None and limits.apply_to(queues, job_types):
                return claim_within_limits(
                    conn,
                    self.dialect,
                    limits,
                    queues=queues,
                    job_types=job_types,
                    limit=limit,
                    worker_id=worker_id,
                    lease_seconds=lease_seconds,
                    ahead=ahead_,
                    now=now,
                    floors=self.claim_floors,
                )
            return claim.claim(
                conn,
                self.dialect,
                queues=queues,
                job_types=job_types,
                limit=limit,
                worker_id=worker_id,
                lease_seconds=lease_seconds,
                ahead=ahead_,
                now=now,
                floors=self.claim_floors,
            )

        settled_by: list[batches.Settled] = []  # the outcomes' settling, once committed

        def write(conn: Connection) -> tuple[set[int], list[list[ClaimedJob]]]:
            landed, settled = self._write_outcomes(
                conn, worker_id, succeeded, failures, results, now, batch_ids
            )
            settled_by[:] = [settled]
            if started:
                outcomes.record_starts(
                    conn, self.dialect, worker_id=worker_id, fences=started, now=now
                )
            claimed = [
                claim_(conn, queues, limit, index < len(ahead) and ahead[index])
                for index, (queues, limit) in enumerate(claims)
            ]
            claimed += [
                claim_(conn, queues, limit, False) if settled.queues.intersection(queues) else []
                for queues, limit in standby
            ]
            return landed, claimed

        outcome = self._in_write(write, relaxed=True)
        self._lower_floors(settled_by)
        return outcome

    def _write_outcomes(
        self,
        conn: Connection,
        worker_id: str,
        succeeded: Sequence[tuple[int, int]],
        failures: Sequence[Failure],
        results: Mapping[int, Any] | None,
        now: datetime | None,
        batch_ids: Sequence[int] | None = None,
    ) -> tuple[set[int], batches.Settled]:
        """Write the outcomes; return the ids whose lease was still ours, and what their
        batches' and workflows' settling made claimable.

        Successes without results that end children of batches (``batch_ids``) are written
        with their batches' counts and their workflows' releases in one statement where the
        backend has writing CTEs (see ``settled_completion.py``)."""
        results = results or {}
        with_result = sum(results.get(job_id) is not None for job_id, _ in succeeded)
        if (
            batch_ids
            and succeeded
            and not failures
            and not with_result
            and self.dialect.supports_modifying_ctes
        ):
            done = settled_completion.complete_and_settle(
                conn,
                self.dialect,
                worker_id=worker_id,
                fences=succeeded,
                batch_ids=batch_ids,
                now=now,
            )
            settled = batches.settle_completed(
                conn, self.dialect, done.landed, done.held, done.released, done.grew, now
            )
            settled = self._settle_unnamed(conn, done.landed, batch_ids, settled, now)
            self.claim_floors.lower(settled.released)  # as below
            return set(done.landed), settled
        plain = len(succeeded) > with_result
        if plain + with_result + len(failures) > 1 and self.dialect.supports_row_locks:
            # Several statements lock these rows one after another: lock them all first, in id
            # order, so two workers' rounds can never wait on each other crosswise (deadlock).
            ids = sorted({job_id for job_id, _ in succeeded} | {f.job_id for f in failures})
            conn.execute(
                self.dialect.lock_row(
                    select(jobs.c.id).where(jobs.c.id.in_(ids)).order_by(jobs.c.id)
                )
            ).all()
        landed = set()
        endings = batches.Endings()
        if succeeded:
            landed = outcomes.complete(
                conn,
                self.dialect,
                worker_id=worker_id,
                fences=succeeded,
                results=results,
                endings=endings,
                now=now,
            )
        for failure in failures:
            if outcomes.fail(
                conn, self.dialect, worker_id=worker_id, failure=failure, endings=endings, now=now
            ):
                landed.add(failure.job_id)
        settled = batches.Settled()
        if endings:  # children of batches ended: count them in this transaction
            settled = batches.settle(conn, self.dialect, endings, now)
            # Released steps more urgent than a claim floor: the claims of this transaction
            # (and of this store's other workers) start before them, without waiting for a probe.
            self.claim_floors.lower(settled.released)
        return landed, settled

    def _settle_unnamed(
        self,
        conn: Connection,
        landed: Mapping[int, int | None],
        batch_ids: Sequence[int],
        settled: batches.Settled,
        now: datetime | None,
    ) -> batches.Settled:
        """Settle, as any ending is, the successes whose batch the caller did not name in
        ``batch_ids`` (the folded statement counts only those it was told of): a wrong list
        costs a statement, never a batch that does not finish or a step never released."""
        named = set(batch_ids)
        missed = batches.Endings()
        for job_id, batch_id in landed.items():
            if batch_id is not None and batch_id not in named:
                missed.ended(batch_id, "succeeded", job_id=job_id)
        if not missed:
            return settled
        more = batches.settle(conn, self.dialect, missed, now)
        return batches.Settled(
            callbacks=[*settled.callbacks, *more.callbacks],
            queues=settled.queues | more.queues,
            released=(*settled.released, *more.released),
        )

    def _lower_floors(self, settled: Sequence[batches.Settled]) -> None:
        """Lower the claim floors to the steps released by a committed transaction, again: a
        claim that ran meanwhile, before the commit, may have moved a floor back past them."""
        for each in settled:
            self.claim_floors.lower(each.released)

    def finish(
        self,
        *,
        worker_id: str,
        succeeded: Sequence[tuple[int, int]],
        failures: Sequence[Failure],
        results: Mapping[int, Any] | None = None,
        now: datetime | None = None,
        batch_ids: Sequence[int] | None = None,
    ) -> set[int]:
        """Write outcomes in one transaction; return the ids whose lease was still ours.
        ``batch_ids``: the batches the ``succeeded`` jobs were claimed with (a job's batch
        never changes), which lets PostgreSQL count them in the completion's statement; the
        outcomes are written alike without them."""

        written = self._in_write(
            lambda conn: self._write_outcomes(
                conn, worker_id, succeeded, failures, results, now, batch_ids
            ),
            relaxed=True,
        )
        self._lower_floors([written[1]])
        return written[0]

    def record_progress(
        self,
        *,
        worker_id: str,
        reports: Sequence[tuple[tuple[int, int], Mapping[str, Any]]],
        lease_seconds: float,
    ) -> set[int]:
        """Store progress reports, extending their jobs' leases."""
        return self._in_write(
            lambda conn: outcomes.record_progress(
                conn,
                self.dialect,
                worker_id=worker_id,
                reports=reports,
                lease_seconds=lease_seconds,
            ),
            relaxed=True,
        )

    def release(
        self, *, worker_id: str, fences: Sequence[tuple[int, int]], now: datetime | None = None
    ) -> set[int]:
        """Give jobs back without burning their attempt (see :func:`outcomes.release`)."""
        return self._in_write(
            lambda conn: outcomes.release(
                conn, self.dialect, worker_id=worker_id, fences=fences, now=now
            )
        )

    def extend_leases(
        self,
        *,
        worker_id: str,
        fences: Sequence[tuple[int, int]],
        lease_seconds: float,
        now: datetime | None = None,
    ) -> dict[int, bool]:
        """Heartbeat the given leases: ids still held, each mapped to "cancel requested"."""
        return self._in_write(
            lambda conn: leases.extend_leases(
                conn,
                self.dialect,
                worker_id=worker_id,
                fences=fences,
                lease_seconds=lease_seconds,
                now=now,
            ),
            relaxed=True,
        )

    def beat(
        self,
        *,
        worker_id: str,
        fences: Sequence[tuple[int, int]],
        lease_seconds: float,
        facts: Mapping[str, Any],
        expires_in: float,
    ) -> dict[int, bool]:
        """A worker's heartbeat, one transaction: write its row in the live workers' table
        (see :func:`workers.announce_worker`), and extend the leases of ``fences`` (see
        :meth:`extend_leases`, whose answer it returns)."""

        def run(conn: Connection) -> dict[int, bool]:
            workers.announce_worker(
                conn, self.dialect, worker_id=worker_id, facts=facts, expires_in=expires_in
            )
            return leases.extend_leases(
                conn,
                self.dialect,
                worker_id=worker_id,
                fences=fences,
                lease_seconds=lease_seconds,
            )

        return self._in_write(run, relaxed=True)

    def reap_expired(
        self, *, limit: int = 100, now: datetime | None = None
    ) -> tuple[list[int], list[int]]:
        """Recover jobs whose lease expired: ``(retried ids, dead ids)``."""
        return self._in_write(
            lambda conn: leases.reap_expired(conn, self.dialect, limit=limit, now=now)
        )

    def database_now(self) -> datetime:
        """The database clock's time now."""

        def read(conn: Connection) -> datetime:
            value: datetime = conn.execute(select(self.dialect.clock())).scalar_one()
            return value

        return in_read(self.engine, self.dialect, read)

    def get_job(self, job_id: int) -> Job | None:
        """Read one job."""
        return in_read(
            self.engine, self.dialect, lambda conn: deadletter.read_job(conn, self.dialect, job_id)
        )

    def get_batch(self, batch_id: int) -> BatchStatus | None:
        """Read one batch and its counts."""
        return in_read(self.engine, self.dialect, lambda conn: batches.read_batch(conn, batch_id))

    def get_workflow(self, workflow_id: int) -> WorkflowStatus | None:
        """Read one workflow and its steps."""
        return in_read(
            self.engine, self.dialect, lambda conn: workflow_reads.read_workflow(conn, workflow_id)
        )

    def cancel(self, job_id: int, record: Record | None = None) -> Job:
        """Cancel one job, or ask its handler to stop (see :mod:`sqlqueue._store.cancel`)."""
        return self._in_write(lambda conn: cancel.cancel_job(conn, self.dialect, job_id, record))
