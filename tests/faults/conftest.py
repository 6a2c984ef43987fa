"""Fixtures of the fault suite: its size factor and a :class:`Faults` harness per database.

Every test runs at size 1 in the default suite (CI) and at size 20 under ``-m slow`` (the
soak: ``nox -s slow``). ``faults`` runs on each conformance backend; ``postgres_faults`` and
``sqlite_faults`` are for the faults that exist on one kind of database only.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.conftest import Backend, migrated_url
from tests.faults._harness import Faults

SOAK = 20


@pytest.fixture(
    params=[pytest.param(1, id="ci"), pytest.param(SOAK, id="soak", marks=pytest.mark.slow)]
)
def size(request: pytest.FixtureRequest) -> int:
    """How much bigger than the CI version this run is (1, or 20 for the soak)."""
    return int(request.param)


def _harness(
    backend: Backend, request: pytest.FixtureRequest, tmp_path: Path, size: int
) -> Iterator[Faults]:
    name = request.node.originalname.removeprefix("test_")
    faults = Faults(backend, tmp_path, size, request.getfixturevalue("capsys"), name)
    try:
        yield faults
    finally:
        faults.close()


@pytest.fixture
def faults(
    backend: Backend, request: pytest.FixtureRequest, tmp_path: Path, size: int
) -> Iterator[Faults]:
    """The harness on each backend (a SQLite file, PostgreSQL)."""
    yield from _harness(backend, request, tmp_path, size)


@pytest.fixture
def postgres_faults(request: pytest.FixtureRequest, tmp_path: Path, size: int) -> Iterator[Faults]:
    """The harness on PostgreSQL only (faults of a database server)."""
    url = migrated_url(request, "postgresql", tmp_path)
    engine = sa.create_engine(url)
    try:
        backend = Backend(name="postgresql", url=url, engine=engine)
        yield from _harness(backend, request, tmp_path, size)
    finally:
        engine.dispose()


@pytest.fixture
def sqlite_faults(request: pytest.FixtureRequest, tmp_path: Path, size: int) -> Iterator[Faults]:
    """The harness on a SQLite file only (faults of several processes sharing one file)."""
    url = migrated_url(request, "sqlite", tmp_path)
    engine = sa.create_engine(url)
    try:
        backend = Backend(name="sqlite", url=url, engine=engine)
        yield from _harness(backend, request, tmp_path, size)
    finally:
        engine.dispose()
