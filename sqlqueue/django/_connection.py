"""Enqueue through Django's own database connection, in Django's current transaction.

``task.enqueue(django.db.connection, …)`` must write the job on the connection Django's ORM is
using, inside its ``transaction.atomic()`` block: rolled back with it, invisible until it
commits. SQLAlchemy runs the statements on Django's DB-API connection itself, through an engine
of its own whose dialect neither commits, rolls back nor closes: the transaction and the
connection stay Django's, and SQLAlchemy ending its own view of them touches neither.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils.connection import ConnectionProxy
from sqlalchemy import URL, Connection, Engine, create_engine
from sqlalchemy.pool import StaticPool

from sqlqueue._enqueue import register_connection_type
from sqlqueue._errors import ConfigurationError
from sqlqueue.django._database import database_url

__all__ = ["borrow_connection", "engine_on"]


def _nothing(dbapi_connection: Any) -> None:
    """Ending a transaction or closing the connection is Django's business."""


def _leave_to_django(engine: Engine) -> None:
    """Make ``engine``'s own dialect (no other engine shares it) leave the connection's
    transaction and life to Django: SQLAlchemy ends its view of a transaction with
    ``do_rollback`` and gives a connection up with ``do_close`` or ``do_terminate``."""
    for method in ("do_commit", "do_rollback", "do_close", "do_terminate"):
        setattr(engine.dialect, method, _nothing)


class _Borrowing:
    """One Django connection's engine, and the DB-API connection its pool holds now."""

    def __init__(self, wrapper: BaseDatabaseWrapper) -> None:
        self.raw = wrapper.connection
        self.engine = engine_on(wrapper, self.connect)
        _leave_to_django(self.engine)

    def connect(self) -> Any:
        """The pool's creator: Django's current DB-API connection."""
        return self.raw


#: Per Django connection (one per thread and alias, living as long as the thread): its engine,
#: made once, so the dialect's first-connect queries run once per thread. Weak keys: an entry
#: goes with its thread's connection.
_ENGINES: weakref.WeakKeyDictionary[BaseDatabaseWrapper, _Borrowing] = weakref.WeakKeyDictionary()


def _engine_for(wrapper: BaseDatabaseWrapper) -> Engine:
    borrowing = _ENGINES.get(wrapper)
    if borrowing is None:
        borrowing = _ENGINES[wrapper] = _Borrowing(wrapper)
    elif borrowing.raw is not wrapper.connection:
        # Django reconnected (CONN_MAX_AGE, the end of a request): drop the pool's record of
        # the old connection (closing it is a no-op here); the next checkout wraps the new one.
        borrowing.raw = wrapper.connection
        borrowing.engine.pool.dispose()
    return borrowing.engine


def engine_on(wrapper: BaseDatabaseWrapper, creator: Callable[[], Any]) -> Engine:
    """An engine whose one connection is ``creator()`` (Django's DB-API connection of
    ``wrapper``), with the SQLAlchemy driver Django uses; how its transactions begin and end
    is the caller's to set."""
    url: URL = database_url(wrapper.alias)
    module = type(wrapper.connection).__module__.partition(".")[0]
    options: dict[str, Any] = {
        "creator": creator,
        "poolclass": StaticPool,
        "pool_reset_on_return": None,
    }
    if _dbapi_of(url) != module:
        # Django and sqlqueue's default for this database use different drivers (psycopg2,
        # mysqlclient): compile for the one Django's connection speaks.
        url = url.set(drivername=f"{wrapper.vendor}+{module.lower()}")
    try:
        return create_engine(url, **options)
    except Exception as error:
        raise ConfigurationError(
            f"Django's {wrapper.alias!r} database connects with {module}, which SQLAlchemy "
            f"cannot drive here ({error}); install the driver sqlqueue uses for it"
        ) from error


def _dbapi_of(url: URL) -> str:
    """The top-level module of the DB-API driver SQLAlchemy loads for ``url``."""
    name: str = url.get_dialect().import_dbapi().__name__
    return name.partition(".")[0]


def _wrapper_of(target: Any) -> BaseDatabaseWrapper:
    if isinstance(target, ConnectionProxy):  # django.db.connection: this thread's default
        wrapper: BaseDatabaseWrapper = connections[target.alias]
        return wrapper
    return target


@contextmanager
def borrow_connection(target: Any) -> Iterator[Connection]:
    """The SQLAlchemy ``Connection`` of Django connection ``target``'s current transaction.

    Inside ``atomic()`` the job joins that transaction (no savepoint); an error marks it for
    rollback, as an error of Django's own queries does. Outside one (autocommit), the enqueue
    is a transaction of its own, committed when it returns."""
    wrapper = _wrapper_of(target)
    with transaction.atomic(using=wrapper.alias, savepoint=False):
        wrapper.ensure_connection()
        wrapper.validate_thread_sharing()
        with _engine_for(wrapper).connect() as conn:
            yield conn


register_connection_type(BaseDatabaseWrapper, borrow_connection)
register_connection_type(ConnectionProxy, borrow_connection)
