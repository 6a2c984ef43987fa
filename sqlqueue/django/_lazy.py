"""The Django queue: a :class:`~sqlqueue.Queue` on ``DATABASES[alias]``, found at each use.

``sqlqueue.django.queue()`` runs when the app's tasks module is imported — in a test, before
Django's test runner points the alias at the test database. So the queue keeps the alias, not
a database: each use (a read, an enqueue's checks, a worker's start) reads the alias's
settings as they are then and takes the engine of that database (one per distinct database,
made at its first use). Inside a ``TestCase``'s transaction, or on Django's in-memory SQLite
test database, it runs on Django's own connection instead (see ``_shared.py``).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.core import mail
from django.db import DEFAULT_DB_ALIAS, connections
from sqlalchemy import Engine, create_engine
from sqlalchemy.pool import NullPool

from sqlqueue._liveness import check_connections_at_checkout
from sqlqueue._middleware import for_sync_handlers
from sqlqueue._queue import Queue
from sqlqueue._store.admin import Admin
from sqlqueue._store.store import Store
from sqlqueue._worker.loop import Worker
from sqlqueue.dialects import Dialect, dialect_for
from sqlqueue.django._database import connect_options, database_url, overridden, settings_of
from sqlqueue.django._handlers import django_connections
from sqlqueue.django._shared import SharedConnection, shared_connection, shares

__all__ = ["DjangoQueue"]


@dataclass(frozen=True)
class _Database:
    """What the queue runs on for one database: its engine, dialect and statements."""

    engine: Engine
    dialect: Dialect
    store: Store
    admin: Admin

    @classmethod
    def on(cls, engine: Engine, dialect: Dialect) -> _Database:
        """The statements on ``engine``; what is missing is made by Django's ``migrate``."""
        dialect.migrated_by = (
            "`python manage.py migrate`"
            if dialect.schema is None
            else f"`python manage.py sqlqueue_migrate --schema {dialect.schema}`"
        )
        tables = dialect.bind_tables(engine)
        return cls(engine, dialect, Store(tables, dialect), Admin(tables, dialect))


def _testing() -> bool:
    """Whether Django's test environment is set up (its test runner, pytest-django): it
    keeps the outgoing mail in ``django.core.mail.outbox`` then, and only then."""
    return hasattr(mail, "outbox")


class DjangoQueue(Queue):
    """A queue on Django's ``DATABASES[alias]``, resolved at each use (see the module)."""

    def __init__(self, alias: str = DEFAULT_DB_ALIAS, **queue_options: Any) -> None:
        #: The alias in ``DATABASES`` whose database this queue uses.
        self.alias = alias
        self._databases: dict[str, _Database] = {}
        self._on_shared: weakref.WeakKeyDictionary[SharedConnection, _Database] = (
            weakref.WeakKeyDictionary()
        )
        #: The connection lent to the queue last (the test's thread's): other threads, the
        #: worker's among them, use it as long as it is lent.
        self._lent: SharedConnection | None = None
        self._making = threading.Lock()
        super().__init__(alias, **queue_options)
        # The outermost middleware: Django's connections looked after around each handler.
        self.middleware(for_sync_handlers(django_connections(self.lent_connection)))

    def _bind(self, engine: Engine | str) -> None:
        """Nothing to bind now: the alias is read at each use. Checked that it exists."""
        settings_of(self.alias)

    # -- the database of this moment ----------------------------------------------------------

    def lent_connection(self) -> SharedConnection | None:
        """The Django connection lent to this queue now (in a test), or ``None``: none while
        ``override_settings`` moves the alias elsewhere (Django's connection stays behind)."""
        if overridden(self.alias) is not None:
            return None
        lent = self._lent
        if lent is not None and shares(lent.wrapper):
            return lent
        here = connections[self.alias]
        if shares(here):
            lent = self._lent = shared_connection(here)
            return lent
        return None

    def _database(self) -> _Database:
        lent = self.lent_connection()
        if lent is not None:
            return self._on_lent(lent.refreshed())
        return self._own()

    def _on_lent(self, lent: SharedConnection) -> _Database:
        with self._making:
            database = self._on_shared.get(lent)
            if database is None:
                database = _Database.on(lent.engine, dialect_for(lent.engine, self.schema))
                self._on_shared[lent] = database
            return database

    def _own(self) -> _Database:
        url = database_url(self.alias)
        options = connect_options(self.alias)
        key = f"{url.render_as_string(hide_password=False)} {options!r}"
        database = self._databases.get(key)
        if database is not None:
            return database
        with self._making:
            database = self._databases.get(key)
            if database is None:
                # In a test run, no connection stays open between uses: Django drops the test
                # database at the end, and PostgreSQL refuses while a session is connected.
                pool: dict[str, Any] = {"poolclass": NullPool} if _testing() else {}
                engine = create_engine(url, connect_args=options, **pool)
                dialect = dialect_for(engine, self.schema)
                dialect.prepare_engine(engine)
                if dialect.supports_many_hosts:
                    # As Queue does for a URL: a pooled connection the server dropped while
                    # idle is replaced at checkout rather than failing a worker's next claim.
                    check_connections_at_checkout(engine, dialect)
                database = self._databases[key] = _Database.on(engine, dialect)
            return database

    @property
    def engine(self) -> Engine:
        """The engine of the alias's database now."""
        return self._database().engine

    @engine.setter
    def engine(self, value: Engine) -> None:
        raise AttributeError("a Django queue's engine is DATABASES[alias]'s; set that instead")

    @property
    def dialect(self) -> Dialect:
        """The dialect of the alias's database now."""
        return self._database().dialect

    @dialect.setter
    def dialect(self, value: Dialect) -> None:
        raise AttributeError("a Django queue's dialect is DATABASES[alias]'s")

    @property
    def store(self) -> Store:
        """The worker's statements on the alias's database now."""
        return self._database().store

    @store.setter
    def store(self, value: Store) -> None:
        raise AttributeError("a Django queue's store is DATABASES[alias]'s")

    @property
    def admin(self) -> Admin:
        """The operators' statements on the alias's database now."""
        return self._database().admin

    def worker(
        self,
        *,
        queues: Sequence[str] | Mapping[str, int] | None = None,
        concurrency: int = 4,
        poll_interval: float = 1.0,
        shutdown_timeout: float = 30.0,
        reaper_interval: float | None = None,
        listen: bool = True,
        metrics_port: int | None = None,
        metrics_interval: float = 15.0,
    ) -> Worker:
        """:meth:`Queue.worker`; on a lent connection (a test) without PostgreSQL's wake-ups,
        whose listener would hold the one connection for itself."""
        return super().worker(
            queues=queues,
            concurrency=concurrency,
            poll_interval=poll_interval,
            shutdown_timeout=shutdown_timeout,
            reaper_interval=reaper_interval,
            listen=listen and self.lent_connection() is None,
            metrics_port=metrics_port,
            metrics_interval=metrics_interval,
        )
