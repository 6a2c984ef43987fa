"""Schema migrations: run sqlqueue's alembic revisions against a database.

The revisions live in the repository's top-level ``migrations/`` and are shipped inside the
wheel as ``sqlqueue/_migrations``, so an installed package can migrate on its own.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine

from sqlqueue._errors import ConfigurationError
from sqlqueue._store._tx import translated
from sqlqueue.dialects import dialect_for

__all__ = ["migrate", "migrations_dir"]


def migrations_dir() -> Path:
    """Where the revisions are: inside the installed wheel, or the source checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_migrations", here.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise ConfigurationError(  # pragma: no cover - a broken install
        "sqlqueue's migrations are missing from this installation; reinstall sqlqueue"
    )


def alembic_config(connection: Connection) -> Config:
    """An alembic config for sqlqueue's revisions that runs on ``connection``."""
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.attributes["connection"] = connection
    return config


def migrate(target: Engine | Connection | str, *, revision: str = "head") -> None:
    """Bring sqlqueue's tables to ``revision`` (the latest by default); safe to run repeatedly."""
    if isinstance(target, str):
        target = create_engine(target)
    engine = target if isinstance(target, Engine) else target.engine
    dialect = dialect_for(engine)
    dialect.prepare_engine(engine)

    def run() -> None:
        if isinstance(target, Connection):
            command.upgrade(alembic_config(target), revision)
            return
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), revision)

    translated(dialect, run)
