"""The Django path under load keeps the guarantees: 16 concurrent requests through gunicorn
into a Django view, some rolled back on purpose, while a worker process runs the jobs: 0 lost,
0 duplicated, 0 ghost jobs, counted from the database.

The default run is 5 s per backend; ``-m slow`` (``nox -s django_load``) runs the issue's 20 s.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import Backend
from tests.frameworks.django_load import run_load


def _check(backend: Backend, seconds: float, tmp_path) -> None:
    figures = run_load(backend.url, seconds, tmp_path)
    print(json.dumps({"backend": backend.name, **figures.summary()}))
    assert figures.failed == []
    assert figures.committed  # both paths were taken
    assert figures.rolled_back
    assert figures.orders == len(figures.committed)
    assert figures.jobs == figures.succeeded == figures.orders
    assert (figures.lost, figures.duplicated, figures.ghosts) == (0, 0, 0)


def test_16_concurrent_requests_for_5_s_lose_duplicate_and_ghost_nothing(backend, tmp_path):
    _check(backend, 5.0, tmp_path)


@pytest.mark.slow
def test_16_concurrent_requests_for_20_s_lose_duplicate_and_ghost_nothing(backend, tmp_path):
    _check(backend, 20.0, tmp_path)
