"""Statements sent straight to the driver: one-row inserts, for enqueueing one job at a time,
and the worker's folded completion (see ``settled_completion.py``).

For a one-row INSERT, SQLAlchemy's execution path (cache lookup, parameter processing, an
execution context, a result object) costs as much as the driver's own work, and an application
enqueueing one job per transaction pays it every time. A :class:`DirectStatement` is compiled by
SQLAlchemy once per database dialect, with each value's place and type processing worked out in
advance, and runs on the connection's DBAPI cursor.

It does so only when nothing would notice: no cursor-execute or error listeners on the
connection, no SQL echo or ``sqlalchemy.engine`` INFO logging, no ``schema_translate_map`` of
the connection's own; otherwise :func:`can_run_directly` says no and the caller uses
``Connection.execute``. sqlqueue's tables in a named schema are compiled into the SQL once per
schema (what the translate map of ``_schema.table_options`` does at each execution). Like
SQLAlchemy, it begins the connection's transaction first if none is open, invalidates a
connection that a driver error shows is gone (and marks the pool's older ones stale: after a
server restart one statement fails, not one per pooled connection), and raises SQLAlchemy's
wrapped error, so errors are translated at the dialect boundary as every other statement's are.

Given an Engine (sqlqueue's own transaction), :meth:`DirectStatement.committed_row` goes one
step further where :func:`can_commit_directly` allows: no ``Connection`` at all, a connection
from the pool, the statement and the driver's commit, which is all ``engine.begin()`` does on
the driver's connection there.

What it uses below SQLAlchemy's public API (compiled ``bind_names`` and ``positiontup``, the
dispatch collections, ``Engine._should_log_info``, ``Pool._invalidate``) is asserted by
``tests/test_direct.py`` and ``tests/test_direct_commit.py``, which ``nox -s
direct_sqlalchemy`` runs on every supported SQLAlchemy minor line: measured, the public
``Connection.execute`` path costs 1.3-2x this one's CPU per one-job enqueue, and the Engine
form through ``engine.begin()`` 1.3x the instructions of the form without it.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import Any
from weakref import WeakKeyDictionary

from sqlalchemy import Connection, Engine
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Dialect as SADialect
from sqlalchemy.engine.default import DefaultDialect
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.sql.expression import ClauseElement

__all__ = ["DirectStatement", "can_commit_directly", "can_run_directly"]

_ENGINE_LOG = logging.getLogger("sqlalchemy.engine")


def can_run_directly(conn: Connection) -> bool:
    """Whether a statement on ``conn`` may skip SQLAlchemy's execution path unnoticed."""
    return _runs_unnoticed(conn) and not conn.get_execution_options().get("schema_translate_map")


def can_commit_directly(engine: Engine) -> bool:
    """Whether a transaction of sqlqueue's own on ``engine`` (an enqueue given the Engine) may
    skip SQLAlchemy's ``Connection`` and run on a pooled driver connection unnoticed.

    SQLAlchemy's ``engine.begin()`` around one statement does, on the driver connection, only
    the dialect's ``do_begin`` (nothing: the driver begins), the statement and ``do_commit``
    (the driver's commit); the rest is its bookkeeping and dispatch. So: no connection or
    dialect listener (pool listeners still run: the checkout is the pool's), no logging, no
    execution options of the engine's own (an isolation level, a translate map), and the
    default ``do_begin``/``do_commit``/``do_rollback``."""
    if engine._should_log_info() or _ENGINE_LOG.isEnabledFor(logging.INFO):
        return False
    if (
        engine._has_events or Connection._has_events or engine.dialect._has_events
    ) and _transaction_watched(engine):
        return False
    if engine.get_execution_options():
        return False
    dialect = engine.dialect
    kind = type(dialect)
    return (
        kind.do_begin is DefaultDialect.do_begin
        and kind.do_commit is DefaultDialect.do_commit
        and kind.do_rollback is DefaultDialect.do_rollback
        # Nor replaced on this engine's dialect alone (a framework's connection lent to
        # sqlqueue, whose transactions are savepoints: sqlqueue/django/_shared.py).
        and _OWN_TRANSACTIONS.isdisjoint(vars(dialect))
    )


#: The dialect's methods that begin and end a transaction on the driver's connection.
_OWN_TRANSACTIONS = frozenset({"do_begin", "do_commit", "do_rollback"})


#: What ``engine.begin()`` around one statement dispatches, as connection events.
_TRANSACTION_EVENTS = (
    "engine_connect",
    "begin",
    "commit",
    "rollback",
    "before_execute",
    "after_execute",
    "before_cursor_execute",
    "after_cursor_execute",
)


def _transaction_watched(engine: Engine) -> bool:
    """Whether a listener on ``engine`` (or ``Engine``), on every ``Connection``, or on the
    dialect would see ``engine.begin()``. Only asked once a flag is set: SQLAlchemy never
    clears them, so a listener added and removed again would otherwise turn the path off for
    good. (``_for_class`` is the dispatcher a new ``Connection`` starts from.)"""
    on_engine = engine.dispatch
    classwide: Any = Connection.dispatch  # typed for instances; on the class, its dispatcher
    on_connections = classwide._for_class(Connection)
    on_dialect = engine.dialect.dispatch
    return (
        any(getattr(on_engine, name) for name in _TRANSACTION_EVENTS)
        or any(getattr(on_connections, name) for name in _TRANSACTION_EVENTS)
        or bool(on_dialect.handle_error or on_dialect.do_execute or on_dialect.do_setinputsizes)
    )


def _runs_unnoticed(conn: Connection) -> bool:
    """No listener and no logging would see a statement on ``conn``.

    SQLAlchemy sets ``_has_events`` on the connection (or its class), its engine and its
    dialect when the first listener of theirs is added, and consults only these flags before
    dispatching: with all three unset no listener exists, and the per-event lookups below
    (each builds a joined listener collection) are skipped. They cost a measurable share
    of a one-job enqueue's Python."""
    if conn._echo or _ENGINE_LOG.isEnabledFor(logging.INFO):
        return False
    if not (conn._has_events or conn.engine._has_events or conn.dialect._has_events):
        return True
    dispatch = conn.dispatch
    dialect_dispatch = conn.dialect.dispatch
    return not (
        dispatch.before_cursor_execute
        or dispatch.after_cursor_execute
        or dispatch.before_execute
        or dispatch.after_execute
        or dialect_dispatch.handle_error
        or dialect_dispatch.do_execute
        or dialect_dispatch.do_setinputsizes
    )


@dataclass(frozen=True)
class _Compiled:
    """The statement's SQL for one dialect and how to build its parameters from a row."""

    sql: str
    positional: bool
    names: tuple[str, ...]
    #: The constants' values, already processed, by parameter name.
    constants: dict[str, Any]
    #: The row's values that need their type's bind processor, by key.
    processed: tuple[tuple[str, Callable[[Any], Any]], ...]
    #: Every parameter's value, in ``names`` order, from the row merged with ``constants``.
    pick: Callable[[Mapping[str, Any]], tuple[Any, ...]]

    def parameters(self, values: Mapping[str, Any]) -> Any:
        """The driver's parameters (a tuple, or a dict by name) for the row ``values``.

        One merge and one ``itemgetter`` instead of a loop over the parameters: the loop was
        a measurable share of a one-job enqueue."""
        merged = {**values, **self.constants}  # the constants win, as bound at compile time
        for key, process in self.processed:
            merged[key] = process(merged[key])
        picked = self.pick(merged)
        return picked if self.positional else dict(zip(self.names, picked, strict=True))


class DirectStatement:
    """A statement whose values come from a mapping with ``keys``."""

    def __init__(self, statement: ClauseElement, keys: Collection[str]) -> None:
        self.statement = statement
        self.keys = tuple(keys)
        self._compiled: WeakKeyDictionary[SADialect, dict[str | None, _Compiled]] = (
            WeakKeyDictionary()
        )
        #: The dialect and schema compiled for last and its form: one identity check per call
        #: instead of a weak-key lookup (which makes a weak reference each time).
        self._last: tuple[weakref.ref[SADialect], str | None, _Compiled] | None = None

    def first_row(
        self, conn: Connection, values: Mapping[str, Any], schema: str | None = None
    ) -> Any:
        """Run on ``conn`` (see :func:`can_run_directly`) against the tables in ``schema``
        (``None``: the connection's default); the first row returned, or ``None``."""
        return self._run(conn, values, schema, _first)

    def all_rows(
        self, conn: Connection, values: Mapping[str, Any], schema: str | None = None
    ) -> list[Any]:
        """As :meth:`first_row`, every row the statement returns, as the driver's tuples
        (no result processing: the caller converts the columns it reads)."""
        rows: list[Any] = self._run(conn, values, schema, _all)
        return rows

    def _run(
        self,
        conn: Connection,
        values: Mapping[str, Any],
        schema: str | None,
        fetch: Callable[[Any], Any],
    ) -> Any:
        compiled = self._compiled_for(conn.dialect, schema)
        parameters = compiled.parameters(values)
        if not conn.in_transaction():
            conn.begin()  # what SQLAlchemy's autobegin would do on the first statement
        pooled = conn.connection
        dbapi_connection = pooled.dbapi_connection
        assert dbapi_connection is not None
        cursor = None
        try:
            cursor = dbapi_connection.cursor()  # a closed connection's driver raises here
            cursor.execute(compiled.sql, parameters)
            return fetch(cursor)
        except conn.dialect.loaded_dbapi.Error as error:
            gone = conn.dialect.is_disconnect(error, dbapi_connection, cursor)
            if gone:
                # As SQLAlchemy does: every connection the pool made before this one is stale
                # too (a server restart), so each is replaced at its next checkout.
                conn.engine.pool._invalidate(pooled, error, _checkin=False)
                conn.invalidate(error)
            raise _wrapped(error, compiled.sql, parameters, conn.engine, gone) from error
        except Exception:
            raise
        except BaseException:
            # Interrupted mid-statement (KeyboardInterrupt, a cancelled task): the connection's
            # state is unknown, so it must not go back to the pool (SQLAlchemy does the same).
            conn.invalidate()
            raise
        finally:
            if cursor is not None:
                cursor.close()

    def committed_row(
        self, engine: Engine, values: Mapping[str, Any], schema: str | None = None
    ) -> Any:
        """Run in a transaction of its own on a connection from ``engine``'s pool (see
        :func:`can_commit_directly`) and commit; the first row returned, or ``None``.

        The sequence ``engine.begin()`` sends, without its objects: the statement (the driver
        begins the transaction), the driver's commit, and the connection back to the pool. A
        failed statement or commit is rolled back before the connection goes back; a connection
        that an error shows is gone, or that an interruption left in an unknown state, is
        discarded instead. A database that cannot be reached raises what ``engine.connect()``
        raises then."""
        dialect = engine.dialect
        compiled = self._compiled_for(dialect, schema)
        parameters = compiled.parameters(values)
        try:
            pooled = engine.raw_connection()  # the pool's checkout, with its events and checks
        except dialect.loaded_dbapi.Error as error:  # cannot connect: wrapped as engine.connect()
            gone = dialect.is_disconnect(error, None, None)
            raise sa_exc.DBAPIError.instance(
                None,
                None,
                error,
                dialect.loaded_dbapi.Error,
                hide_parameters=engine.hide_parameters,
                connection_invalidated=gone,
                dialect=dialect,
            ) from error
        try:
            dbapi_connection = pooled.dbapi_connection
            assert dbapi_connection is not None
            cursor = None
            committing = False
            try:
                cursor = dbapi_connection.cursor()  # a closed connection's driver raises here
                cursor.execute(compiled.sql, parameters)
                row = cursor.fetchone()
                committing = True
                dbapi_connection.commit()
            except dialect.loaded_dbapi.Error as error:
                gone = dialect.is_disconnect(error, dbapi_connection, cursor)
                if gone:
                    # Discards this connection and, as SQLAlchemy does, marks every one the
                    # pool made before it stale (a server restart): each is replaced at its
                    # next checkout instead of failing an enqueue of its own.
                    engine.pool._invalidate(pooled, error)
                else:
                    _roll_back(pooled)
                if committing:  # wrapped as SQLAlchemy wraps a failed commit: no statement
                    raise _wrapped(error, None, None, engine, gone) from error
                raise _wrapped(error, compiled.sql, parameters, engine, gone) from error
            finally:
                if cursor is not None:
                    cursor.close()
        except Exception:
            raise
        except BaseException:
            pooled.invalidate()  # as in first_row: never pool a connection in an unknown state
            raise
        finally:
            pooled.close()
        return row

    def _compiled_for(self, dialect: SADialect, schema: str | None) -> _Compiled:
        last = self._last
        if last is not None and last[0]() is dialect and last[1] == schema:
            return last[2]
        by_schema = self._compiled.setdefault(dialect, {})
        compiled = by_schema.get(schema)
        if compiled is None:
            compiled = by_schema[schema] = self._compile(dialect, schema)
        self._last = (weakref.ref(dialect), schema, compiled)
        return compiled

    def _compile(self, dialect: SADialect, schema: str | None) -> _Compiled:
        placement: dict[str, Any] = (
            {}
            if schema is None
            else {"schema_translate_map": {None: schema}, "render_schema_translate": True}
        )
        compiled: Any = self.statement.compile(
            dialect=dialect, column_keys=list(self.keys), **placement
        )
        if compiled.literal_execute_params or compiled.post_compile_params:
            raise TypeError("a direct statement cannot have parameters rendered at execution")
        by_name = {name: bind for bind, name in compiled.bind_names.items()}
        names = tuple(compiled.positiontup if compiled.positional else by_name)
        constants: dict[str, Any] = {}
        processed: list[tuple[str, Callable[[Any], Any]]] = []
        for name in dict.fromkeys(names):
            bind = by_name[name]
            process = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if name in self.keys:
                if process is not None:
                    processed.append((name, process))
            else:
                value = bind.effective_value
                constants[name] = value if process is None else process(value)
        return _Compiled(
            sql=compiled.string,
            positional=bool(compiled.positional),
            names=names,
            constants=constants,
            processed=tuple(processed),
            pick=_picker(names),
        )


def _first(cursor: Any) -> Any:
    return cursor.fetchone()


def _all(cursor: Any) -> Any:
    return cursor.fetchall()


def _roll_back(pooled: PoolProxiedConnection) -> None:
    """Roll back a failed transaction before its connection goes back to the pool; one that
    cannot roll back is discarded instead."""
    try:
        pooled.rollback()
    except Exception:
        pooled.invalidate()


def _wrapped(
    error: Exception, sql: str | None, parameters: Any, engine: Engine, gone: bool
) -> sa_exc.StatementError:
    """The driver's ``error`` as SQLAlchemy wraps it, so the dialect boundary translates it as
    it does every other statement's: with the statement's ``sql`` and ``parameters``, or
    neither for a failed commit."""
    dialect = engine.dialect
    return sa_exc.DBAPIError.instance(
        sql,
        parameters,
        error,
        dialect.loaded_dbapi.Error,
        hide_parameters=engine.hide_parameters,
        connection_invalidated=gone,
        dialect=dialect,
    )


def _picker(names: tuple[str, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """The values at ``names`` of a mapping, always as a tuple (``itemgetter`` of one name
    returns the bare value, and of none is an error)."""
    if len(names) > 1:
        return itemgetter(*names)
    return lambda mapping: tuple(mapping[name] for name in names)
