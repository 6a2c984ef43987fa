"""The direct statement path (``sqlqueue/_store/_direct.py``) against the SQLAlchemy internals
it reads, so that a new SQLAlchemy release that changes them fails here, by name, rather than
as a wrong row or a listener silently skipped.

It reads below the public API: a compiled statement's ``bind_names``, ``positional``,
``positiontup``, ``literal_execute_params`` and ``post_compile_params``; a bind parameter's
``effective_value`` and its type's bind processor; the event dispatch collections of the
connection (``before_cursor_execute`` …) and of the dialect (``handle_error``, ``do_execute``,
``do_setinputsizes``); ``DBAPIError.instance`` and ``Dialect.is_disconnect``. ``nox -s
direct_sqlalchemy`` runs this file on each supported SQLAlchemy minor line.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.sql.elements import BindParameter

from sqlqueue._store._direct import DirectStatement, can_run_directly
from sqlqueue._types import UtcDateTime
from tests.conftest import Backend

_metadata = sa.MetaData()

#: A scratch table: a value with a bind processor (the timestamp), one without, a constant.
PROBE = sa.Table(
    "test_direct_probe",
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("name", sa.String(40), nullable=False, unique=True),
    sa.Column("moment", UtcDateTime(), nullable=False),
    sa.Column("kind", sa.String(20), nullable=False),
)
KEYS = ("name", "moment")
#: The constant bound at compile time, so the direct path sends it from its own cache.
KIND = "probe"
STATEMENT = (
    PROBE.insert()
    .values(name=sa.bindparam("name"), moment=sa.bindparam("moment", type_=UtcDateTime()))
    .values(kind=sa.bindparam("probe_kind", KIND, type_=sa.String()))
    .returning(PROBE.c.id)
)
#: Placeholders of the DB-API paramstyles: ``?``, ``:1``/``$1``, ``%s`` and named ones.
PLACEHOLDER = re.compile(r"\?|%s|[:$]\d+|%\((\w+)\)s|(?<![:\w]):(\w+)")


@pytest.fixture
def probe(backend: Backend) -> Iterator[sa.Engine]:
    """The backend's engine with the scratch table created (and dropped afterwards)."""
    _metadata.create_all(backend.engine)
    try:
        yield backend.engine
    finally:
        _metadata.drop_all(backend.engine)


def test_a_compiled_statement_has_the_shape_the_direct_path_reads(backend: Backend):
    dialect = backend.engine.dialect
    compiled: Any = STATEMENT.compile(dialect=dialect, column_keys=list(KEYS))
    assert isinstance(compiled.string, str)
    assert not compiled.literal_execute_params
    assert not compiled.post_compile_params
    bind_names = compiled.bind_names
    assert isinstance(bind_names, dict)
    assert all(
        isinstance(bind, BindParameter) and isinstance(name, str)
        for bind, name in bind_names.items()
    )
    assert sorted(bind_names.values()) == ["moment", "name", "probe_kind"]
    by_name = {name: bind for bind, name in bind_names.items()}
    assert by_name["probe_kind"].effective_value == KIND
    for bind in bind_names:
        process = bind.type.dialect_impl(dialect).bind_processor(dialect)
        assert process is None or callable(process)

    found = PLACEHOLDER.findall(compiled.string)
    assert isinstance(compiled.positional, bool)
    if compiled.positional:
        # One name per placeholder, in the order the values appear in the SQL.
        assert list(compiled.positiontup) == ["name", "moment", "probe_kind"]
        assert len(found) == len(compiled.positiontup)
    else:
        assert sorted(named or colon for named, colon in found) == sorted(bind_names.values())


def test_a_direct_row_equals_the_one_sqlalchemy_writes(probe: sa.Engine):
    """The values reach the right columns, processed by their types (an aware timestamp in
    another zone is stored as UTC), and the compile-time constant is sent as bound."""
    direct = DirectStatement(STATEMENT, KEYS)
    moment = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=timezone(timedelta(hours=2)))
    with probe.begin() as conn:
        assert can_run_directly(conn)
        (direct_id,) = direct.first_row(conn, {"name": "direct", "moment": moment})
        (executed_id,) = conn.execute(STATEMENT, {"name": "executed", "moment": moment}).one()
    with probe.connect() as conn:
        rows = {
            row.id: row
            for row in conn.execute(sa.select(PROBE.c.id, PROBE.c.moment, PROBE.c.kind)).all()
        }
    assert (rows[direct_id].moment, rows[direct_id].kind) == (moment, KIND)
    assert rows[direct_id].moment.tzinfo == UTC
    assert rows[direct_id][1:] == rows[executed_id][1:]


def test_a_driver_error_is_wrapped_as_sqlalchemy_wraps_it(backend: Backend, probe: sa.Engine):
    """Same exception class and original error as through ``Connection.execute``, parameters
    hidden where the engine hides them, and the connection kept (not a disconnect)."""
    direct = DirectStatement(STATEMENT, KEYS)
    row = {"name": "twice", "moment": datetime.now(UTC)}
    with probe.begin() as conn:
        direct.first_row(conn, row)
    errors: list[sa_exc.DBAPIError] = []
    for run in (
        lambda conn: direct.first_row(conn, row),
        lambda conn: conn.execute(STATEMENT, row),
    ):
        with probe.connect() as conn, pytest.raises(sa_exc.DBAPIError) as raised:
            run(conn)
        assert not conn.invalidated
        errors.append(raised.value)
    ours, theirs = errors
    assert type(ours) is type(theirs)
    assert isinstance(ours, sa_exc.IntegrityError)
    assert type(ours.orig) is type(theirs.orig)
    assert isinstance(ours.orig, probe.dialect.loaded_dbapi.Error)
    assert not ours.connection_invalidated
    assert "[parameters:" in str(ours)

    hidden = sa.create_engine(backend.url, hide_parameters=True)
    try:
        with hidden.connect() as conn, pytest.raises(sa_exc.IntegrityError) as raised:
            direct.first_row(conn, row)
        assert raised.value.hide_parameters
        assert "[parameters:" not in str(raised.value)
        assert "[SQL parameters hidden" in str(raised.value)
    finally:
        hidden.dispose()


def _listen(event: str) -> Callable[[sa.Engine], None]:
    def on(engine: sa.Engine) -> None:
        sa.event.listen(engine, event, lambda *args, **kwargs: None)

    return on


def _echo(engine: sa.Engine) -> None:
    engine.echo = True


@pytest.mark.parametrize(
    "watch",
    [
        *(
            pytest.param(_listen(event), id=event)
            for event in (
                "before_cursor_execute",
                "after_cursor_execute",
                "before_execute",
                "after_execute",
                "handle_error",
                "do_execute",
                "do_setinputsizes",
            )
        ),
        pytest.param(_echo, id="echo"),
    ],
)
def test_anything_watching_statements_sends_them_through_sqlalchemy(
    backend: Backend, watch: Callable[[sa.Engine], None]
):
    """Each listener lands in the dispatch collection ``can_run_directly`` checks: were one
    moved or renamed, the direct path would bypass it unseen."""
    engine = sa.create_engine(backend.url)
    try:
        with engine.connect() as conn:
            assert can_run_directly(conn)
        watch(engine)
        with engine.connect() as conn:
            assert not can_run_directly(conn)
    finally:
        engine.dispose()


def test_sql_logging_and_schema_translation_send_statements_through_sqlalchemy(backend: Backend):
    engine = sa.create_engine(backend.url)
    try:
        with engine.connect() as conn:
            assert can_run_directly(conn)
            translated = conn.execution_options(schema_translate_map={None: "other"})
            assert not can_run_directly(translated)
        log = logging.getLogger("sqlalchemy.engine")
        level = log.level
        log.setLevel(logging.INFO)
        try:
            with engine.connect() as conn:
                assert not can_run_directly(conn)
        finally:
            log.setLevel(level)
    finally:
        engine.dispose()


@pytest.mark.parametrize("on", ["connection", "class"])
def test_a_listener_on_the_connection_or_its_class_sends_statements_through_sqlalchemy(
    backend: Backend, on: str
):
    """Listeners need not be on the engine: one on the open connection itself, or on every
    ``Connection``, sets another of the flags ``can_run_directly`` reads first."""
    engine = sa.create_engine(backend.url)

    def nothing(*args: object, **kwargs: object) -> None:
        return None

    try:
        with engine.connect() as conn:
            assert can_run_directly(conn)
            target: object = conn if on == "connection" else sa.engine.Connection
            sa.event.listen(target, "before_cursor_execute", nothing)
            try:
                assert not can_run_directly(conn)
            finally:
                sa.event.remove(target, "before_cursor_execute", nothing)
    finally:
        engine.dispose()
