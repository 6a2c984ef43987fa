"""One log line per written outcome, so an operator can follow a job through the worker's log."""

from __future__ import annotations

import logging

from sqlqueue._worker.classify import Outcome

__all__ = ["log_outcome"]

log = logging.getLogger("sqlqueue.worker")


def log_outcome(outcome: Outcome, landed: bool) -> None:
    """Log what became of one attempt once its outcome was written (or found stale)."""
    job = outcome.job
    failure = outcome.failure
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
        )
    elif failure is None:
        log.debug("job %d (%s) succeeded in %.3f s", job.id, job.job_type, outcome.elapsed)
    elif failure.snooze:
        log.info(
            "job %d (%s) snoozed for %.1f s (the attempt does not count)",
            job.id,
            job.job_type,
            failure.retry_in,
        )
    elif failure.dead:
        log.error(
            "job %d (%s) is dead after attempt %d/%d: %s",
            job.id,
            job.job_type,
            job.attempt,
            job.max_attempts,
            failure.last_error,
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
        )
