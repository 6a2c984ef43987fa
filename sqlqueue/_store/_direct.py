"""One-row statements sent straight to the driver, for enqueueing one job at a time.

For a one-row INSERT, SQLAlchemy's execution path (cache lookup, parameter processing, an
execution context, a result object) costs as much as the driver's own work, and an application
enqueueing one job per transaction pays it every time. A :class:`DirectStatement` is compiled by
SQLAlchemy once per database dialect, with each value's place and type processing worked out in
advance, and runs on the connection's DBAPI cursor.

It does so only when nothing would notice: no cursor-execute or error listeners on the
connection, no SQL echo or ``sqlalchemy.engine`` INFO logging, no ``schema_translate_map``;
otherwise :func:`can_run_directly` says no and the caller uses ``Connection.execute``. Like
SQLAlchemy, it begins the connection's transaction first if none is open, invalidates a
connection that a driver error shows is gone, and raises SQLAlchemy's wrapped error, so errors
are translated at the dialect boundary as every other statement's are.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

from sqlalchemy import Connection
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Dialect as SADialect
from sqlalchemy.sql.expression import ClauseElement

__all__ = ["DirectStatement", "can_run_directly"]

_ENGINE_LOG = logging.getLogger("sqlalchemy.engine")


def can_run_directly(conn: Connection) -> bool:
    """Whether a statement on ``conn`` may skip SQLAlchemy's execution path unnoticed."""
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
        or conn.engine.echo
        or _ENGINE_LOG.isEnabledFor(logging.INFO)
        or conn.engine.logger.isEnabledFor(logging.INFO)  # e.g. sqlalchemy.engine.Engine
        or conn.get_execution_options().get("schema_translate_map")
    )


@dataclass(frozen=True)
class _Compiled:
    """The statement's SQL for one dialect and where each parameter's value comes from."""

    sql: str
    positional: bool
    names: tuple[str, ...]
    #: Every parameter's value: the constants already processed, ``None`` where a row's goes.
    template: tuple[Any, ...]
    #: Where the row's values go: position, key and the type's bind processor, if any.
    slots: tuple[tuple[int, str, Callable[[Any], Any] | None], ...]


class DirectStatement:
    """A one-row statement whose values come from a mapping with ``keys``."""

    def __init__(self, statement: ClauseElement, keys: Collection[str]) -> None:
        self.statement = statement
        self.keys = tuple(keys)
        self._compiled: WeakKeyDictionary[SADialect, _Compiled] = WeakKeyDictionary()

    def first_row(self, conn: Connection, values: Mapping[str, Any]) -> Any:
        """Run on ``conn`` (see :func:`can_run_directly`); the first row returned, or ``None``."""
        compiled = self._compiled.get(conn.dialect)
        if compiled is None:
            compiled = self._compiled[conn.dialect] = self._compile(conn.dialect)
        row = list(compiled.template)
        for index, key, process in compiled.slots:
            row[index] = values[key] if process is None else process(values[key])
        parameters: Any = (
            tuple(row) if compiled.positional else dict(zip(compiled.names, row, strict=True))
        )
        if not conn.in_transaction():
            conn.begin()  # what SQLAlchemy's autobegin would do on the first statement
        dbapi_connection = conn.connection.dbapi_connection
        assert dbapi_connection is not None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(compiled.sql, parameters)
            return cursor.fetchone()
        except conn.dialect.loaded_dbapi.Error as error:
            gone = conn.dialect.is_disconnect(error, dbapi_connection, cursor)
            if gone:
                conn.invalidate(error)
            raise sa_exc.DBAPIError.instance(
                compiled.sql,
                parameters,
                error,
                conn.dialect.loaded_dbapi.Error,
                hide_parameters=conn.engine.hide_parameters,
                connection_invalidated=gone,
                dialect=conn.dialect,
            ) from error
        except Exception:
            raise
        except BaseException:
            # Interrupted mid-statement (KeyboardInterrupt, a cancelled task): the connection's
            # state is unknown, so it must not go back to the pool (SQLAlchemy does the same).
            conn.invalidate()
            raise
        finally:
            cursor.close()

    def _compile(self, dialect: SADialect) -> _Compiled:
        compiled: Any = self.statement.compile(dialect=dialect, column_keys=list(self.keys))
        if compiled.literal_execute_params or compiled.post_compile_params:
            raise TypeError("a direct statement cannot have parameters rendered at execution")
        by_name = {name: bind for bind, name in compiled.bind_names.items()}
        names = tuple(compiled.positiontup if compiled.positional else by_name)
        template: list[Any] = []
        slots: list[tuple[int, str, Callable[[Any], Any] | None]] = []
        for index, name in enumerate(names):
            bind = by_name[name]
            process = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if name in self.keys:
                template.append(None)
                slots.append((index, name, process))
            else:
                value = bind.effective_value
                template.append(value if process is None else process(value))
        return _Compiled(
            sql=compiled.string,
            positional=bool(compiled.positional),
            names=names,
            template=tuple(template),
            slots=tuple(slots),
        )
