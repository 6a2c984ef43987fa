"""sqlqueue on Django's own connection, where a connection of its own would see the wrong data.

Django's ``TestCase`` runs each test inside a transaction that it rolls back at the end, and
Django's SQLite test database is in memory, which only the connection that made it can
reach. A queue's own connections would see neither the jobs a test enqueued nor, in memory,
the tables. So while an alias's connection is inside a ``TestCase``'s transaction, or its
database is in memory, the queue runs its statements on that very DB-API connection
(:func:`shares`), as Django's ``LiveServerTestCase`` lends an in-memory database's connection
to its server thread:

- each of the queue's transactions is a savepoint inside the one open (or, with none open, a
  transaction of its own), and the dialect knows the connection as *borrowed*
  (``Dialect.borrow``: no ``BEGIN IMMEDIATE``, no ``SET TRANSACTION``, sqlqueue's decoding);
- one thread at a time uses the connection: the worker's database thread takes :attr:`lock`
  for each transaction, a handler's thread for the whole handler (``_handlers.py``), which
  then sees the test's data through Django's ORM on the same connection.

Transactions are begun and ended on the DB-API connection, not through Django's wrapper:
a drain serves its worker on an event loop in the test's thread, where Django refuses its
own database calls (``SynchronousOnlyOperation``).
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from sqlqueue.dialects import dialect_for
from sqlqueue.django._connection import engine_on

__all__ = ["SharedConnection", "shared_connection", "shares"]


def shares(wrapper: BaseDatabaseWrapper) -> bool:
    """Whether the queue must run on ``wrapper``'s own connection: its database is in memory
    (Django's SQLite test database), or it is inside a ``TestCase``'s transaction (which Django
    marks ``_from_testcase``; a durable ``atomic()`` reads the same mark)."""
    in_memory = getattr(wrapper, "is_in_memory_db", None)
    if in_memory is not None and in_memory():
        return True
    return any(getattr(block, "_from_testcase", False) for block in wrapper.atomic_blocks)


class SharedConnection:
    """Django connection ``wrapper`` lent to the queue: an engine on its DB-API connection
    whose transactions are savepoints, and the lock its users take in turn."""

    def __init__(self, wrapper: BaseDatabaseWrapper) -> None:
        self.wrapper = wrapper
        self.alias: str = wrapper.alias
        #: Held for each of the queue's transactions and around each handler call.
        self.lock = threading.RLock()
        self.raw = wrapper.connection
        #: The transactions open now, innermost last: (thread, savepoint name or None).
        self._open: list[tuple[int, str | None]] = []
        self._names = itertools.count(1)
        self.engine = engine_on(wrapper, self._connect)
        dialect_for(self.engine).borrow(self.engine)
        dialect = self.engine.dialect
        dialect.do_begin = self._begin  # type: ignore[method-assign]
        dialect.do_commit = self._commit  # type: ignore[method-assign]
        dialect.do_rollback = self._rollback  # type: ignore[method-assign]
        dialect.do_close = _nothing  # type: ignore[method-assign]
        dialect.do_terminate = _nothing  # type: ignore[method-assign]

    def _connect(self) -> Any:
        return self.raw

    def refreshed(self) -> SharedConnection:
        """This, after Django reconnected (the pool then wraps the new connection)."""
        if self.raw is not self.wrapper.connection:
            self.raw = self.wrapper.connection
            self.engine.pool.dispose()
        return self

    def _begin(self, dbapi_connection: Any) -> None:
        self.lock.acquire()
        try:
            if self.wrapper.in_atomic_block or self._open:
                name: str | None = f"sqlqueue_{next(self._names)}"
                _run(dbapi_connection, f"SAVEPOINT {name}")
            else:
                name = None
                _run(dbapi_connection, "BEGIN")
        except BaseException:
            self.lock.release()
            raise
        self._open.append((threading.get_ident(), name))

    def _commit(self, dbapi_connection: Any) -> None:
        name = self._end()
        try:
            _run(dbapi_connection, "COMMIT" if name is None else f"RELEASE SAVEPOINT {name}")
        finally:
            self.lock.release()

    def _rollback(self, dbapi_connection: Any) -> None:
        if not self._open or self._open[-1][0] != threading.get_ident():
            return  # SQLAlchemy's rollback after its first connect: nothing of ours is open
        name = self._end()
        try:
            if name is None:
                _run(dbapi_connection, "ROLLBACK")
            else:
                _run(dbapi_connection, f"ROLLBACK TO SAVEPOINT {name}")
                _run(dbapi_connection, f"RELEASE SAVEPOINT {name}")
        finally:
            self.lock.release()

    def _end(self) -> str | None:
        _, name = self._open.pop()
        return name

    @contextmanager
    def lent(self) -> Iterator[None]:
        """This thread's Django connection of the alias is the shared one for the block, under
        the lock: a handler's ORM queries see what the test wrote, one thread at a time."""
        with self.lock:
            mine = connections[self.alias]
            if mine is self.wrapper:
                yield
                return
            self.wrapper.inc_thread_sharing()
            connections[self.alias] = self.wrapper
            try:
                yield
            finally:
                connections[self.alias] = mine
                self.wrapper.dec_thread_sharing()


def _nothing(dbapi_connection: Any) -> None:
    """Closing the connection is Django's business."""


def _run(dbapi_connection: Any, statement: str) -> None:
    """One transaction-control statement on the DB-API connection (the names are ours)."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(statement)
    finally:
        cursor.close()


#: Per Django connection, the one lent to queues (weak: it goes with its thread's connection).
_SHARED: weakref.WeakKeyDictionary[BaseDatabaseWrapper, SharedConnection] = (
    weakref.WeakKeyDictionary()
)
_SHARED_LOCK = threading.Lock()


def shared_connection(wrapper: BaseDatabaseWrapper) -> SharedConnection:
    """``wrapper`` lent to sqlqueue (made once per Django connection), connected."""
    if wrapper.connection is None:
        wrapper.ensure_connection()
    with _SHARED_LOCK:
        shared = _SHARED.get(wrapper)
        if shared is None:
            shared = _SHARED[wrapper] = SharedConnection(wrapper)
        return shared.refreshed()
