"""One log line per written outcome, so an operator can follow a job through the worker's log.

Each record carries the job's fields (``job_id``, ``job_type``, ``queue``, ``attempt``,
``worker_id``) as ``extra``, for a JSON log to index; a success is logged at DEBUG, and its
fields are only built when DEBUG is on.
"""

from __future__ import annotations

import logging

from sqlqueue._logs import job_fields
from sqlqueue._worker.classify import Outcome

__all__ = ["log_outcome"]

log = logging.getLogger("sqlqueue.worker")


def log_outcome(outcome: Outcome, landed: bool, worker_id: str) -> None:
    """Log what became of one attempt once its outcome was written (or found stale)."""
    job = outcome.job
    failure = outcome.failure
    if landed and failure is None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "job %d (%s) succeeded in %.3f s",
                job.id,
                job.job_type,
                outcome.elapsed,
                extra=job_fields(job, worker_id),
            )
        return
    fields = job_fields(job, worker_id)
    if not landed:
        log.warning(
            "lost the lease on job %d (%s, attempt %d): the reaper or another worker "
            "took it over, so this attempt's outcome was discarded%s",
            job.id,
            job.job_type,
            job.attempt,
            " and its transaction rolled back (none of its writes landed)"
            if outcome.recorded
            else "",
            extra=fields,
        )
    elif failure is None:
        return  # a success: logged above
    elif failure.snooze:
        log.info(
            "job %d (%s) snoozed for %.1f s (the attempt does not count)",
            job.id,
            job.job_type,
            failure.retry_in,
            extra=fields,
        )
    elif failure.dead:
        log.error(
            "job %d (%s) is dead after attempt %d/%d: %s",
            job.id,
            job.job_type,
            job.attempt,
            job.max_attempts,
            failure.last_error,
            extra=fields,
        )
    else:
        log.warning(
            "job %d (%s) attempt %d/%d failed: %s; retrying in %.1f s",
            job.id,
            job.job_type,
            job.attempt,
            job.max_attempts,
            failure.last_error,
            failure.retry_in,
            extra=fields,
        )
