"""docs/security.md names the test behind each of its promises ("a promise here without a test
is a bug in this page"): every test file it names exists, every test it names is defined, and
every section after the summary says what tests it (issue 44).

A renamed or deleted test would otherwise leave the page citing a proof that no longer runs.
"""

from __future__ import annotations

import re

from tests._support import REPO_ROOT

PAGE = REPO_ROOT / "docs" / "security.md"
#: A test file the page names, as a path from the repository root.
_FILE = re.compile(r"\btests/[\w/]+\.py\b")
#: A test function the page names, bare or after ``file.py::``.
_TEST = re.compile(r"(?<![/\w])test_\w+(?!\.py)\b")


def _defined_tests() -> set[str]:
    """The names of every test function under tests/."""
    names: set[str] = set()
    for path in (REPO_ROOT / "tests").rglob("test_*.py"):
        names.update(re.findall(r"^\s*(?:async )?def (test_\w+)", path.read_text(), re.M))
    return names


def _sections(text: str) -> dict[str, str]:
    """The page's ``## `` sections by heading."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_test_file_the_page_names_exists() -> None:
    named = sorted(set(_FILE.findall(PAGE.read_text())))
    assert named, "the page names no test file"
    assert [path for path in named if not (REPO_ROOT / path).is_file()] == []


def test_every_test_the_page_names_is_defined() -> None:
    text = _FILE.sub("", PAGE.read_text())  # what is left of a path is not a test's name
    named = set(_TEST.findall(text))
    assert len(named) > 20, sorted(named)
    assert sorted(named - _defined_tests()) == []


def test_every_section_says_which_tests_hold_it() -> None:
    sections = _sections(PAGE.read_text())
    assert "The short version" in sections
    untested = [
        heading
        for heading, body in sections.items()
        if heading != "The short version" and not _TEST.search(_FILE.sub("", body))
    ]
    assert untested == []


def test_a_missing_test_would_be_caught() -> None:
    """The check itself: a name no test defines is reported."""
    text = "Tested by `tests/test_web.py::test_that_was_renamed_long_ago`."
    named = set(_TEST.findall(_FILE.sub("", text)))
    assert named == {"test_that_was_renamed_long_ago"}
    assert named - _defined_tests() == named
