"""What a test marked ``backend_independent`` may do, checked on every such test collected.

Such a test runs on one backend (the first of ``SQLQUEUE_TEST_BACKENDS``) because its subject is
not the database: a page in a browser, the SMTP protocol, email headers, webhook HTTP. That is
only true while the test makes no claim about a backend: it never asks which backend it is on
(``backend.name``), what the backend can do (``capable``, ``requires``), or for the backend's
dialect, and it never reads the database server's own state. ``nox -s independent`` runs the
same tests on every backend (``SQLQUEUE_TEST_EVERY_BACKEND=1``) for a change that might make
one of them depend on it.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from tests._support.source import parse

#: What a test that depends on its backend reaches for.
BACKEND_SPECIFIC = {"capable", "requires", "dialect_for", "capabilities"}
SERVER_STATE = ("pg_stat", "information_schema", "innodb", "sqlite_master", "pragma")


def _claims_about_the_backend(function: object) -> list[str]:
    """The places in ``function``'s source that ask about the backend it runs on."""
    source = textwrap.dedent(inspect.getsource(function))  # type: ignore[arg-type]
    found = []
    for node in ast.walk(parse(source)):
        if isinstance(node, ast.Attribute) and (
            node.attr in BACKEND_SPECIFIC
            or (
                node.attr == "name"
                and isinstance(node.value, ast.Name)
                and node.value.id == "backend"
            )
        ):
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Name) and node.id in BACKEND_SPECIFIC:
            found.append(f"line {node.lineno}: {node.id}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            lowered = node.value.lower()
            found += [f"line {node.lineno}: {word!r}" for word in SERVER_STATE if word in lowered]
    return found


def test_a_test_marked_backend_independent_makes_no_claim_about_its_backend(
    request: pytest.FixtureRequest,
) -> None:
    marked = [
        item
        for item in request.session.items
        if isinstance(item, pytest.Function) and item.get_closest_marker("backend_independent")
    ]
    offenders = {
        item.nodeid: claims
        for item in marked
        if (claims := _claims_about_the_backend(item.function))
    }
    assert not offenders, offenders


def test_the_check_sees_a_claim_about_the_backend() -> None:
    def asks(backend: object) -> None:
        if backend.name == "sqlite":  # type: ignore[attr-defined]
            backend.requires("row_locks")  # type: ignore[attr-defined]

    def reads_the_server(conn: object) -> None:
        conn.exec_driver_sql("SELECT count(*) FROM pg_stat_activity")  # type: ignore[attr-defined]

    def does_neither(backend: object) -> None:
        assert backend is not None

    assert _claims_about_the_backend(asks) == ["line 2: .name", "line 3: .requires"]
    assert _claims_about_the_backend(reads_the_server) == ["line 2: 'pg_stat'"]
    assert _claims_about_the_backend(does_neither) == []
