"""The FastAPI test app (no ``from __future__ import annotations``: FastAPI reads the routes' local
annotations at run time): ``POST /signups`` writes a user and enqueues its welcome job with the
request's ``AsyncSession``, in one transaction; ``fail=true`` raises after both are written."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

import sqlqueue
from tests.frameworks.welcome import users


def create_app(queue: sqlqueue.Queue, *, lifespan: Any = None) -> FastAPI:
    """The app on ``queue``'s database (its tasks registered already); ``lifespan`` is
    ``sqlqueue.asgi.lifespan(…)`` to run a worker in the app."""
    engine = queue.async_engine()
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    welcome = queue.tasks["welcome"]
    hold = queue.tasks["hold"]

    @asynccontextmanager
    async def app_lifespan(app: FastAPI) -> AsyncIterator[Any]:
        try:
            if lifespan is None:
                yield None
            else:
                async with lifespan(app) as state:
                    yield state
        finally:
            await engine.dispose()  # its connections belong to this run's event loop

    app = FastAPI(lifespan=app_lifespan)

    async def session() -> AsyncIterator[AsyncSession]:
        async with sessions() as opened:
            yield opened

    Session = Annotated[AsyncSession, Depends(session)]

    @app.post("/signups", status_code=201)
    async def sign_up(email: str, db: Session, fail: bool = False) -> dict[str, int]:
        async with db.begin():
            result: Any = await db.execute(users.insert().values(email=email))
            user_id = int(result.inserted_primary_key[0])
            job_id = await welcome.enqueue_async(db, user_id=user_id)
            if fail:
                raise HTTPException(status_code=409, detail="refused after the writes")
        return {"user": user_id, "job": job_id}

    @app.post("/holds", status_code=201)
    async def hold_one(db: Session) -> dict[str, int]:
        async with db.begin():
            return {"job": await hold.enqueue_async(db)}

    return app
