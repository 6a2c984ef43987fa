"""The ledger queue built the way the README says to reach PostgreSQL through PgBouncer.

``SQLQUEUE_DATABASE_URL`` points at PgBouncer in transaction mode. psycopg 3 must not prepare
statements there (a later transaction may run on another server connection, which does not
know them), so the engine is built with ``prepare_threshold=None``; the worker is started with
``--no-listen``.
"""

from __future__ import annotations

import os

import sqlalchemy as sa

import sqlqueue
from tests.apps.ledger import register_ledger_tasks

engine = sa.create_engine(
    os.environ["SQLQUEUE_DATABASE_URL"],
    pool_pre_ping=True,
    connect_args={"prepare_threshold": None},
)
queue = sqlqueue.Queue(engine)
register_ledger_tasks(queue)
