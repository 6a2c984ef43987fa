"""A FastAPI app whose signups enqueue a welcome job in the request's transaction, with a worker
running inside the app (``sqlqueue.asgi.lifespan``).

Run the demo (an SQLite file in a temporary directory; it signs two users up through FastAPI's
test client, one of them rolled back, and shows what ran)::

    python examples/fastapi_app.py

Serve it for real (``DATABASE_URL`` names the database, migrated at start)::

    DATABASE_URL=sqlite:///shop.db uvicorn examples.fastapi_app:app
"""

import os
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import Depends, FastAPI, HTTPException
from fastapi.testclient import TestClient
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

import sqlqueue
import sqlqueue.asgi

DATABASE_URL = os.environ.get("DATABASE_URL") or (
    f"sqlite:///{tempfile.mkdtemp(prefix='sqlqueue-fastapi-')}/shop.db"
)
engine = sa.create_engine(DATABASE_URL)
queue = sqlqueue.Queue(engine)
metadata = sa.MetaData()
users = sa.Table(
    "example_users",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("email", sa.String(200), nullable=False),
    sa.Column("welcomed", sa.Boolean, nullable=False, default=False),
)


@queue.task("welcome")
def welcome(user_id: int) -> None:
    """Send the welcome (here: mark the user welcomed)."""
    with engine.begin() as conn:
        conn.execute(users.update().where(users.c.id == user_id).values(welcomed=True))


sessions = async_sessionmaker(queue.async_engine(), expire_on_commit=False)
worker = sqlqueue.asgi.lifespan(queue, queues=["default"], concurrency=2)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[Any]:
    """The tables, then a worker for as long as the app runs (stopped gracefully)."""
    metadata.create_all(engine)
    sqlqueue.migrate(engine)
    async with worker(app) as state:
        yield state
    await queue.async_engine().dispose()


app = FastAPI(lifespan=lifespan)


async def session() -> AsyncIterator[AsyncSession]:
    async with sessions() as opened:
        yield opened


@app.post("/signups", status_code=201)
async def sign_up(
    email: str, db: Annotated[AsyncSession, Depends(session)], fail: bool = False
) -> dict[str, int]:
    """The user and the welcome job commit together, or neither does."""
    async with db.begin():
        result: Any = await db.execute(users.insert().values(email=email))
        user_id = int(result.inserted_primary_key[0])
        job_id = await welcome.enqueue_async(db, user_id=user_id)
        if fail:
            raise HTTPException(status_code=409, detail="refused: the transaction rolls back")
    return {"user": user_id, "job": job_id}


def _succeeded(job_id: int) -> bool:
    job = queue.get_job(job_id)
    return job is not None and job.status is sqlqueue.JobStatus.SUCCEEDED


def main() -> None:
    with TestClient(app) as client:
        kept = client.post("/signups", params={"email": "ada@example.com"}).json()
        refused = client.post("/signups", params={"email": "bob@example.com", "fail": True})
        print(f"signed up user {kept['user']}, job {kept['job']}")
        print(f"refused signup: HTTP {refused.status_code}, nothing of it kept")
        deadline = time.monotonic() + 30
        while not _succeeded(kept["job"]):  # the app's worker runs it meanwhile
            if time.monotonic() > deadline:
                raise SystemExit("the welcome job did not run within 30 s")
            time.sleep(0.05)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(users.c.email, users.c.welcomed)).all()
    print(f"users: {[tuple(row) for row in rows]}; jobs: {queue.stats().by_status}")


if __name__ == "__main__":
    main()
