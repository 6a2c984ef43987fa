"""The ledger of sent messages (table ``sqlqueue_email_sent``), by dedup key.

A row is written through the job's own transaction (``ctx.transaction_async()``), so it commits
together with the job's success or not at all; an attempt looks its key up before it sends and,
if the key is there, does not send again. These are the app-level statements any handler could
write against its own table: Core expressions, every value bound, run on the table in the
queue's schema (``ctx.schema``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from sqlqueue._schema import email_sent, table_options  # declared with every table
from sqlqueue.dialects import dialect_for
from sqlqueue.email._smtp import Delivery

__all__ = ["find_sent", "record_sent"]


def find_sent(engine: sa.Engine, key: str, schema: str | None = None) -> dict[str, Any] | None:
    """The ledger's entry for ``key`` as a job result, or ``None`` if nothing was sent under it."""
    query = sa.select(email_sent).where(email_sent.c.key == key)
    with engine.connect() as conn:
        row = conn.execute(query, execution_options=table_options(schema)).mappings().first()
        # Ended as sqlqueue's own reads are (PostgreSQL: a COMMIT rather than the pool's
        # ROLLBACK, at which psycopg would forget the connection's prepared statements).
        dialect_for(engine, schema).end_read(conn)
    if row is None:
        return None
    return {
        "message_id": row["message_id"],
        "reply": row["reply"],
        "accepted": list(row["accepted"]),
        "refused": dict(row["refused"]),
        "sent_at": row["sent_at"].isoformat(),
        "sent_by_job": row["job_id"],
    }


async def record_sent(
    conn: AsyncConnection,
    *,
    key: str,
    message_id: str,
    job_id: int,
    sent_at: datetime,
    delivery: Delivery,
    schema: str | None = None,
) -> None:
    """Add the entry for ``key`` in the job's transaction (a duplicate key fails the insert,
    and the attempt with it: its retry then finds the key and sends nothing)."""
    await conn.execute(
        email_sent.insert().values(
            key=key,
            message_id=message_id,
            job_id=job_id,
            sent_at=sent_at,
            reply=delivery.reply,
            accepted=delivery.accepted,
            refused=delivery.refused,
        ),
        execution_options=table_options(schema),
    )
