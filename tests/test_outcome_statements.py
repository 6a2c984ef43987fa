"""The statements of a leased job's outcomes name job statuses as literals, never as bound
parameters: the completion, the failure (retry, dead, snooze) and the heartbeat.

Their fence tests ``status = 'running'`` and their ``SET`` writes the new status. Where a bound
value meets a partial index's predicate (``ix_sqlqueue_jobs_lease`` is ``WHERE status =
'running'``), SQLite prepares the statement again at every run, and the driver binds at every
run: on SQLite the completion took about 0.38 ms with its statuses bound, 0.09 ms as literals.
The claim's statement is held to the same in ``test_claim_statement.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from sqlqueue._store.leases import extend_statement
from sqlqueue._store.outcomes import complete_statement, fail_statement
from sqlqueue._store.rows import Failure
from sqlqueue.dialects import dialect_for
from tests.conftest import Backend

STATUSES = {"queued", "failed", "running", "succeeded", "dead", "cancelled", "waiting"}
FENCES = [(7, 1), (8, 2)]


def _bound(backend: Backend, statement: Any) -> set[Any]:
    return {
        value
        for value in statement.compile(backend.engine).params.values()
        if isinstance(value, str)
    }


@pytest.mark.parametrize("with_result", [False, True])
def test_the_completion_binds_no_status(backend: Backend, with_result: bool) -> None:
    statement = complete_statement(dialect_for(backend.engine), None, with_result=with_result)
    assert not _bound(backend, statement) & STATUSES


@pytest.mark.parametrize(
    ("dead", "snooze"),
    [(False, False), (True, False), (False, True)],
    ids=["retry", "dead", "snooze"],
)
def test_the_failure_binds_no_status(backend: Backend, dead: bool, snooze: bool) -> None:
    failure = Failure(
        job_id=7,
        attempt=1,
        dead=dead,
        retry_in=0.0,
        snooze=snooze,
        last_error="RuntimeError: again",
        errors=[],
    )
    statement = fail_statement(dialect_for(backend.engine), worker_id="w1", failure=failure)
    assert not _bound(backend, statement) & STATUSES


def test_the_heartbeat_binds_no_status(backend: Backend) -> None:
    statement = extend_statement(
        dialect_for(backend.engine), worker_id="w1", fences=FENCES, lease_seconds=30.0
    )
    assert not _bound(backend, statement) & STATUSES
