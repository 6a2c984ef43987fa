"""``RETURNING`` and ``ON CONFLICT`` on MariaDB and MySQL, emulated in the caller's transaction.

* ``UPDATE … RETURNING`` (neither server has it): lock the rows the WHERE clause matches with
  ``SELECT id … FOR UPDATE`` (or the statement's own lock query, the claim's ``SKIP LOCKED``
  one), run the UPDATE restricted to those ids, then select the returned columns by id. The
  rows stay locked until the transaction ends, so what is read back is what was written.
  Where the WHERE clause lists the keys (every fenced transition: ``id IN (…)``), the lock
  query goes by the primary key (``FORCE INDEX (PRIMARY)``), never through a secondary
  index: see :func:`_by_key`.
* ``DELETE … RETURNING`` and ``INSERT … RETURNING`` (MariaDB has them, MySQL not): natively
  where the server can, else the rows are read before the DELETE, or by the inserted id after
  each INSERT.
* ``ON CONFLICT DO NOTHING``: a plain INSERT whose duplicate-key error (1062) is caught. InnoDB
  rolls back only the failed statement, and it waits for an uncommitted conflicting row first,
  as PostgreSQL does. Writers of one key take turns under a named lock (``GET_LOCK``), which
  keeps a crowd of them out of InnoDB's duplicate-key deadlock.
* Upserts: lock the conflicting row and evaluate ``where`` and the new values against it in
  one ``SELECT … FOR UPDATE``; no row: INSERT (a concurrent insert of the same key makes it
  fail with 1062, and the read is tried again, now waiting for that row); a row where ``where``
  holds: UPDATE it to the values computed. All new values are computed from the old row, as
  SQL's simultaneous assignment wants (MySQL's SET assigns left to right), and a false
  ``where`` leaves the row alone and returns nothing. The key's named lock is held throughout.

The results are ordinary cursor results of the final SELECT, with the RETURNING columns in
order, so callers read them as they would read ``RETURNING``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import (
    ColumnElement,
    Connection,
    Delete,
    Insert,
    Result,
    Select,
    String,
    Table,
    Update,
    and_,
    bindparam,
    false,
    func,
    select,
    true,
    update,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.mysql import Insert as MySQLInsert
from sqlalchemy.sql import operators
from sqlalchemy.sql.elements import (
    BinaryExpression,
    BindParameter,
    BooleanClauseList,
    ClauseElement,
)

from sqlqueue._errors import DatabaseUnavailable

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

__all__ = ["LOCK_OPTION", "ConflictInsert", "Rows", "run_returning"]

#: What a statement with RETURNING gives: rows of any shape.
Rows = Result[*tuple[Any, ...]]
#: A Connection; an ORM Session (webhook endpoints are written through either) is run alike.
Conn = Connection

#: The execution option under which an UPDATE carries its own lock query (the claim's).
LOCK_OPTION = "sqlqueue_lock"
#: ER_DUP_ENTRY.
_DUPLICATE_KEY = 1062
#: How long a writer of a conflict key waits for its turn (InnoDB's lock wait is 50 s).
_KEY_LOCK_SECONDS = 60
#: Rounds of the upsert's read-then-insert before giving up (each lost race waits for the
#: winner's row, so a second round finds it).
_UPSERT_ROUNDS = 5


@dataclass(frozen=True)
class _Conflict:
    """What an INSERT does about an existing row with the same ``index_elements``: nothing
    (``set_`` is ``None``), or update it with ``set_`` where ``where`` holds."""

    index_elements: tuple[str, ...]
    set_: Mapping[str, Any] | None = None
    where: ColumnElement[bool] | None = None


class ConflictInsert(MySQLInsert):
    """The MySQL INSERT construct with PostgreSQL's and SQLite's ``on_conflict_*`` methods.

    Executed as it is, ``on_conflict_do_nothing`` compiles to ``ON DUPLICATE KEY UPDATE`` of
    the primary key to itself (a no-op); with ``RETURNING`` or an update it must go through
    :func:`run_returning`, which reads the conflict from the construct.
    """

    inherit_cache = True
    sqlqueue_conflict: _Conflict | None = None

    def on_conflict_do_nothing(self, index_elements: Sequence[Any]) -> ConflictInsert:
        """Skip the row if one with the same ``index_elements`` exists."""
        key = self.table.primary_key.columns.values()[0]  # type: ignore[attr-defined]
        new = self.on_duplicate_key_update({key.name: key})
        new.sqlqueue_conflict = _Conflict(_names(index_elements))
        return new

    def on_conflict_do_update(
        self,
        index_elements: Sequence[Any],
        set_: Mapping[str, Any],
        where: ColumnElement[bool],
    ) -> ConflictInsert:
        """Update the existing row with ``set_`` where ``where`` holds (run by
        :func:`run_returning` only)."""
        new = self._generate()
        new.sqlqueue_conflict = _Conflict(_names(index_elements), dict(set_), where)
        return new


def _names(elements: Sequence[Any]) -> tuple[str, ...]:
    return tuple(element if isinstance(element, str) else element.name for element in elements)


def run_returning(conn: Connection | Session, stmt: Any, params: Any = None) -> Rows:
    """Execute ``stmt`` as PostgreSQL would, its RETURNING rows as the result."""
    return _run(cast(Connection, conn), stmt, params)


def _run(conn: Conn, stmt: Any, params: Any) -> Rows:
    conflict = getattr(stmt, "sqlqueue_conflict", None)
    if isinstance(stmt, ConflictInsert) and conflict is not None:
        if conflict.set_ is not None:
            return _upsert(conn, stmt, conflict)
        if _returning(stmt):
            return _insert_unless_duplicate(conn, stmt, params)
        return _insert_if_absent(conn, stmt, conflict)
    if not _returning(stmt):
        return conn.execute(stmt, params)
    if isinstance(stmt, Update):
        return _update(conn, stmt, params)
    if isinstance(stmt, Delete):
        return (
            conn.execute(stmt, params)
            if conn.dialect.delete_returning
            else _delete(conn, stmt, params)
        )
    if isinstance(stmt, Insert):
        return _insert(conn, stmt, params)
    return conn.execute(stmt, params)


def _returning(stmt: Any) -> tuple[Any, ...]:
    return tuple(getattr(stmt, "_returning", ()))


def _without_returning(stmt: Any) -> Any:
    """A copy of ``stmt`` without its RETURNING clause (SQLAlchemy has no public way back)."""
    copy = stmt._generate()
    copy._returning = ()
    return copy


def _key(table: Table) -> Any:
    """The one-column primary key the emulation finds rows by again (every sqlqueue table a
    RETURNING statement targets has one; a composite key is a programming error here)."""
    columns = list(table.primary_key.columns)
    if len(columns) != 1:
        raise ValueError(
            f"MySQL's RETURNING emulation finds rows by a one-column primary key; "
            f"{table.name} has {len(columns)}"
        )
    return columns[0]


def _read_back(
    conn: Conn,
    stmt: Any,
    where: ColumnElement[bool],
    order: Any = None,
    *,
    params: Mapping[str, Any] | None = None,
) -> Rows:
    """The RETURNING columns of the rows ``where`` selects (the key, for a statement without
    RETURNING whose result nobody reads)."""
    columns = _returning(stmt) or tuple(stmt.table.primary_key.columns)
    query: Select[Any] = select(*columns).where(where)
    if order is not None:
        query = query.order_by(order)
    return conn.execute(query, params)


def _update(conn: Conn, stmt: Update, params: Mapping[str, Any] | None) -> Rows:
    table = stmt.table
    assert isinstance(table, Table)
    key = _key(table)
    lock: Select[Any] | None = stmt.get_execution_options().get(LOCK_OPTION)
    if lock is None:
        lock = _by_key(select(key).where(_where(stmt)).order_by(key).with_for_update(), key)
    ids = list(conn.execute(lock, params).scalars())
    if not ids:
        return _read_back(conn, stmt, false())
    chosen = key.in_(bindparam("sqlqueue_ids", expanding=True))
    conn.execute(_without_returning(stmt).where(chosen), {**(params or {}), "sqlqueue_ids": ids})
    return _read_back(conn, stmt, key.in_(ids), key)


#: The index hint that has a statement find its rows by the primary key.
_PRIMARY = "FORCE INDEX (PRIMARY)"


def _by_key(lock: Select[Any], key: Any) -> Select[Any]:
    """``lock`` (a locking read of ``key``'s table) through the primary key when its WHERE
    clause lists the keys (``key = …`` or ``key IN (…)`` of values among its conditions, not
    of a subquery), else as it is.

    A locking read through a secondary index locks the row's entry there, then the row. A
    transaction that holds the row and changes that entry (a ``status`` the status index
    holds) then waits for the reader, which waits for it: InnoDB aborts one of them. A
    worker's heartbeat (``status = 'running' … id IN (…)``, which the planner may take by
    ``ix_sqlqueue_jobs_status``) and a job completed in its handler's transaction met so, and
    the aborted completion took the handler's work and an attempt with it. Going by the key,
    a reader waits for the row before it holds any entry of it, as every writer of the row
    does: the row is the one lock they meet on. (The UPDATE after it may go through any
    index: its transaction holds the rows by then.)"""
    where = lock.whereclause
    if where is None:
        return lock
    terms = (
        where.clauses
        if isinstance(where, BooleanClauseList) and where.operator is operators.and_
        else [where]
    )
    if any(
        isinstance(term, BinaryExpression)
        and term.operator in (operators.eq, operators.in_op)
        and term.left.compare(key)
        and isinstance(term.right, BindParameter)
        for term in terms
    ):
        return lock.with_hint(key.table, _PRIMARY)
    return lock


def _where(stmt: Update | Delete) -> ColumnElement[bool]:
    """The statement's WHERE clause (a DML statement without one matches every row)."""
    where = stmt.whereclause
    return true() if where is None else where


def _delete(conn: Conn, stmt: Delete, params: Mapping[str, Any] | None) -> Rows:
    """MySQL: the rows are read (and locked) first, then deleted by key."""
    table = stmt.table
    assert isinstance(table, Table)
    key = _key(table)
    lock = _by_key(select(key).where(_where(stmt)).with_for_update(), key)
    ids = list(conn.execute(lock, params).scalars())
    rows = _read_back(conn, stmt, key.in_(ids) if ids else false(), params=params)
    buffered = rows.freeze()
    if ids:
        conn.execute(_without_returning(stmt).where(key.in_(ids)), params)
    return buffered()


def _insert(
    conn: Conn, stmt: Insert, params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None
) -> Rows:
    """MariaDB inserts with RETURNING itself; MySQL row by row, reading each back by id."""
    if conn.dialect.insert_returning:
        return conn.execute(stmt, params)
    table = stmt.table
    assert isinstance(table, Table)
    key = _key(table)
    plain = _without_returning(stmt)
    rows = [params] if params is None or isinstance(params, Mapping) else list(params)
    ids = []
    for row in rows:
        inserted = conn.execute(plain, row)
        inserted_key = inserted.inserted_primary_key
        assert inserted_key is not None
        ids.append(inserted_key[0])
    order = _ordered_by(key, ids)
    return _read_back(conn, stmt, key.in_(ids), order)


def _ordered_by(key: Any, ids: list[Any]) -> Any:
    """``FIELD(key, ids…)``: the rows in the order they were inserted."""
    return func.field(key, *ids)


def _insert_unless_duplicate(
    conn: Conn, stmt: ConflictInsert, params: Mapping[str, Any] | None
) -> Rows:
    """``ON CONFLICT DO NOTHING RETURNING``: the INSERT's rows, or none on a duplicate key.
    Several rows go one at a time, so one duplicate skips only its own row."""
    plain = _without_duplicate_key(stmt)
    conflict = stmt.sqlqueue_conflict
    assert conflict is not None
    table = stmt.table
    assert isinstance(table, Table)
    key = _key(table)
    rows = [params] if params is None or isinstance(params, Mapping) else list(params)
    ids = []
    for row in rows:
        try:
            with _turn(conn, table, _conflict_values(stmt, conflict, row)):
                found = _insert(conn, select_key(plain, key), row).scalar()
        except sa_exc.IntegrityError as error:
            if _code(error) != _DUPLICATE_KEY:
                raise
            continue
        ids.append(found)
    return _read_back(conn, stmt, key.in_(ids) if ids else false(), key)


def _conflict_values(
    stmt: Any, conflict: _Conflict, params: Mapping[str, Any] | None
) -> tuple[Any, ...]:
    """The values of the conflict columns: the statement's own, or the execution's."""
    values = {getattr(column, "key", column): value for column, value in stmt._values.items()}
    found = []
    for name in conflict.index_elements:
        value = (params or {}).get(name, values.get(name))
        found.append(getattr(value, "value", value))  # a bound parameter's value
    return tuple(found)


@contextmanager
def _turn(conn: Conn, table: Table, values: tuple[Any, ...]) -> Iterator[None]:
    """Hold a named lock (``GET_LOCK``) on one conflict key while inserting or upserting it:
    transactions racing for a key take turns. Without it, waiters that all saw the holder's
    uncommitted row hold shared locks on it once it commits or rolls back, and then each
    wants it exclusively — InnoDB's classic duplicate-key deadlock, which would roll back the
    caller's whole transaction (PostgreSQL's ``ON CONFLICT`` has no such failure).

    Named locks are the server's, not a database's: the name includes the session's database
    (see :func:`database_lock_name`), so two apps on one server never wait for each other's
    keys."""
    digest = hashlib.sha1(repr((table.fullname, values)).encode(), usedforsecurity=False)
    name = database_lock_name(digest.hexdigest())
    got = conn.execute(select(func.get_lock(name, _KEY_LOCK_SECONDS))).scalar()
    if got != 1:
        raise DatabaseUnavailable(
            f"waited over {_KEY_LOCK_SECONDS} s for another transaction writing the same key "
            f"of {table.name}"
        )
    try:
        yield
    finally:
        # A connection lost meanwhile took the lock with it (named locks live in the session);
        # releasing it there would raise over the error that lost it.
        if not conn.invalidated:
            conn.execute(select(func.release_lock(name))).scalar()


def database_lock_name(key: str) -> ColumnElement[str]:
    """A ``GET_LOCK`` name for ``key`` in the session's own database, computed by the server:
    ``sqlqueue:`` and the SHA-1 of ``DATABASE()`` and ``key`` (49 characters, under the
    64 that MariaDB and MySQL allow). Bound, never formatted into the SQL."""
    scoped = func.concat(func.coalesce(func.database(), ""), ":", bindparam(None, key, String()))
    return func.concat("sqlqueue:", func.sha1(scoped), type_=String())


def _insert_if_absent(conn: Conn, stmt: ConflictInsert, conflict: _Conflict) -> Rows:
    """``ON CONFLICT DO NOTHING`` without RETURNING: a plain read first, so a row another
    transaction holds locked is not waited for (the no-op ``ON DUPLICATE KEY UPDATE`` would
    lock it); the INSERT's duplicate-key error covers a row inserted in between."""
    table = stmt.table
    assert isinstance(table, Table)
    match = _match(table, stmt, conflict)
    if conn.execute(select(_key(table)).where(match)).first() is not None:
        return _read_back(conn, stmt, false())
    try:
        conn.execute(_without_duplicate_key(stmt))
    except sa_exc.IntegrityError as error:
        if _code(error) != _DUPLICATE_KEY:
            raise
    return _read_back(conn, stmt, false())


def _match(table: Table, stmt: Any, conflict: _Conflict) -> ColumnElement[bool]:
    """The existing row's condition: its conflict columns equal the statement's values."""
    values = {getattr(column, "key", column): value for column, value in stmt._values.items()}
    return and_(*(table.c[name] == values[name] for name in conflict.index_elements))


def _without_duplicate_key(stmt: ConflictInsert) -> Any:
    """``stmt`` without the no-op ``ON DUPLICATE KEY UPDATE``: a duplicate must fail."""
    plain = stmt._generate()
    plain._post_values_clause = None
    return plain


def select_key(stmt: Insert, key: Any) -> Insert:
    """``stmt`` returning only the key."""
    return _without_returning(stmt).returning(key)  # type: ignore[no-any-return]


def _code(error: sa_exc.DBAPIError) -> int | None:
    args = getattr(error.orig, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _upsert(conn: Conn, stmt: ConflictInsert, conflict: _Conflict) -> Rows:
    table = stmt.table
    assert isinstance(table, Table)
    assert conflict.set_ is not None
    assert conflict.where is not None
    values = dict(stmt._values or {})
    names: dict[str, Any] = {getattr(c, "key", str(c)): value for c, value in values.items()}
    match = _match(table, stmt, conflict)
    # Expressions are evaluated against the locked row; plain values are written as they are.
    assignments = [(n, v) for n, v in conflict.set_.items() if isinstance(v, ClauseElement)]
    constants = {n: v for n, v in conflict.set_.items() if not isinstance(v, ClauseElement)}
    state = (
        select(conflict.where.label("sqlqueue_where"), *(value for _, value in assignments))
        .select_from(table)
        .where(match)
        .with_for_update()
    )
    with _turn(conn, table, _conflict_values(stmt, conflict, None)):
        return _upsert_in_turn(conn, stmt, table, state, names, match, assignments, constants)


def _upsert_in_turn(
    conn: Conn,
    stmt: ConflictInsert,
    table: Table,
    state: Select[Any],
    names: Mapping[str, Any],
    match: ColumnElement[bool],
    assignments: Sequence[tuple[str, Any]],
    constants: Mapping[str, Any],
) -> Rows:
    for _ in range(_UPSERT_ROUNDS):
        row = conn.execute(state).first()
        if row is None:
            try:
                conn.execute(Insert(table).values(names))
            except sa_exc.IntegrityError as error:
                if _code(error) != _DUPLICATE_KEY:
                    raise
                continue  # another transaction inserted it first: read it, locked, again
            return _read_back(conn, stmt, match)
        if not row[0]:
            return _read_back(conn, stmt, false())
        new: dict[str, Any] = {
            name: bindparam(None, value, type_=table.c[name].type)
            for (name, _), value in zip(assignments, row[1:], strict=True)
        }
        new.update(constants)
        conn.execute(update(table).where(match).values(new))
        return _read_back(conn, stmt, match)
    raise sa_exc.InvalidRequestError(  # pragma: no cover - each lost race waits for the winner
        f"upsert into {table.name} kept losing races"
    )
