"""The queue the metrics and logging tests run: jobs that succeed, fail once then succeed, go
dead, and log (through ``ctx.logger`` and through the app's own logger, sync and async).

``python -m sqlqueue worker tests.apps.observe_app:queue`` with ``SQLQUEUE_DATABASE_URL`` set.
"""

from __future__ import annotations

import logging
import os

import sqlqueue
from tests.apps import UNOPENED_DATABASE

queue = sqlqueue.Queue(os.environ.get("SQLQUEUE_DATABASE_URL", UNOPENED_DATABASE))

log = logging.getLogger("tests.observe_app")


@queue.task("succeed")
def succeed(n: int) -> int:
    return n


@queue.task("flaky", max_attempts=3, backoff=[0.0])
def flaky(ctx: sqlqueue.JobContext) -> None:
    if ctx.attempt == 1:
        raise RuntimeError("the first attempt fails")


@queue.task("doomed", max_attempts=2, backoff=[0.0])
def doomed() -> None:
    log.warning("doomed is about to fail")
    raise RuntimeError("this job always fails")


@queue.task("chatty")
def chatty(ctx: sqlqueue.JobContext) -> None:
    ctx.logger.info("hello from the handler")
    log.info("hello from the app's own logger")
    try:
        raise ValueError("something the handler caught")
    except ValueError:
        ctx.logger.exception("the handler logs an exception")


@queue.task("chatty_async")
async def chatty_async() -> None:
    log.info("hello from an async handler")


@queue.task("parked", queue="parked")
def parked() -> None:
    """Enqueued on a queue the test's worker does not serve: its due age grows."""
