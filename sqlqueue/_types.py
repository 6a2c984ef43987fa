"""Column types that map to the best native type on each backend.

These are declarations, not behaviour: SQLAlchemy's type variants pick JSONB on PostgreSQL and
a rowid-backed INTEGER key on SQLite, so the schema itself stays written once.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, Double, Float, Integer, String, cast, type_coerce
from sqlalchemy.dialects.mysql import BINARY, VARBINARY
from sqlalchemy.dialects.mysql import DATETIME as MYSQL_DATETIME
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.sqlite import DATETIME as SQLITE_DATETIME
from sqlalchemy.engine import Dialect as SADialect
from sqlalchemy.types import TypeDecorator

__all__ = [
    "MYSQL_NAMES",
    "EncodedJson",
    "Id",
    "JsonDocument",
    "Number",
    "UtcDateTime",
    "as_utc",
    "exact_text",
]

#: The SQLAlchemy dialect names of MariaDB and MySQL, for type variants.
MYSQL_NAMES = ("mysql", "mariadb")

#: 64-bit ids on PostgreSQL; SQLite only auto-increments a plain ``INTEGER PRIMARY KEY``.
Id = BigInteger().with_variant(Integer(), "sqlite")

#: JSON documents: ``jsonb`` on PostgreSQL, SQLite's JSON text elsewhere.
JsonDocument = JSON().with_variant(JSONB(), "postgresql")

#: Floating-point numbers: MySQL's ``FLOAT`` is single precision, so ``DOUBLE`` there.
Number = Float().with_variant(Double(), *MYSQL_NAMES)


class _SQLiteDateTime(SQLITE_DATETIME):
    """SQLite's ``DATETIME`` (ISO text), also read from a connection that parses it already:
    Django's sqlite3 connections turn declared ``DATETIME`` columns into datetimes, and in a
    test sqlqueue reads through such a connection (sqlqueue/django/_shared.py)."""

    def result_processor(self, dialect: SADialect, coltype: object) -> Any:
        parse = super().result_processor(dialect, coltype)
        if parse is None:  # pragma: no cover - SQLAlchemy always parses SQLite's text
            return None

        def process(value: Any) -> Any:
            return value if value is None or isinstance(value, datetime) else parse(value)

        return process


#: Timestamps: MySQL's ``DATETIME`` drops the fraction unless it is declared with six digits.
_TIMESTAMP = (
    DateTime(timezone=True)
    .with_variant(MYSQL_DATETIME(fsp=6), *MYSQL_NAMES)
    .with_variant(_SQLiteDateTime(timezone=True), "sqlite")  # type: ignore[no-untyped-call]
)


def as_utc(value: datetime) -> datetime:
    """An aware UTC datetime from a driver's value (naive values are UTC already)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class EncodedJson(TypeDecorator[str]):
    """A :data:`JsonDocument` bound from JSON text sqlqueue has already encoded.

    Payload checks encode the payload once to measure it; binding that text as it is spares the
    JSON type a second encoding. PostgreSQL still casts the parameter (``::JSONB``), so the
    server parses and validates it; SQLite stores the text. Only for bind parameters of
    statements that write JSON columns: the column type itself stays :data:`JsonDocument`.
    """

    impl = JsonDocument
    cache_ok = True

    def bind_processor(self, dialect: SADialect) -> None:
        return None


class UtcDateTime(TypeDecorator[datetime]):
    """A timestamp that is always timezone-aware UTC in Python.

    PostgreSQL stores ``timestamptz``; SQLite stores ISO text (``YYYY-MM-DD HH:MM:SS.ffffff``)
    in UTC, the same format the SQLite clock expression produces, so they compare as text;
    MariaDB and MySQL store ``DATETIME(6)`` in UTC (their clock is ``UTC_TIMESTAMP(6)``).
    """

    impl = _TIMESTAMP
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: SADialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"sqlqueue needs timezone-aware datetimes, got naive {value!r}")
        return value.astimezone(UTC)

    def process_result_value(self, value: Any, dialect: SADialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class Utf8Bytes(TypeDecorator[str]):
    """Text stored as its UTF-8 bytes in a MariaDB/MySQL ``VARBINARY``: compared byte for byte.

    Their ``VARCHAR`` collations (``utf8mb4_bin`` too) pad with spaces when they compare, so
    ``"k"`` and ``"k "`` would be one key to a unique index; the NO PAD collations that would
    not differ between MariaDB and MySQL. Bytes compare exactly on both, as text does on
    PostgreSQL and SQLite.
    """

    impl = VARBINARY
    cache_ok = True

    def bind_expression(self, bindvalue: Any) -> Any:
        """The text is sent as text and made bytes by the server (``CAST(… AS BINARY)``: its
        utf8mb4 bytes, trailing spaces kept): aiomysql cannot bind a ``bytes`` parameter with
        current PyMySQL, and the async email kind writes through it."""
        return cast(type_coerce(bindvalue, String()), BINARY())

    def process_bind_param(self, value: str | None, dialect: SADialect) -> str | None:
        return value

    def process_result_value(self, value: Any, dialect: SADialect) -> str | None:
        return None if value is None else bytes(value).decode("utf-8")


def exact_text(length: int) -> Any:
    """Text of at most ``length`` characters that every backend compares exactly (trailing
    spaces count): a ``VARCHAR`` elsewhere, :class:`Utf8Bytes` (up to 4 bytes a character) on
    MariaDB/MySQL."""
    return String(length).with_variant(Utf8Bytes(4 * length), *MYSQL_NAMES)
