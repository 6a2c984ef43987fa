"""Every python block of docs/guides/workers-and-middleware.md runs as written (SQLite in a
temporary directory), each in a fresh namespace."""

from __future__ import annotations

import re

import pytest

from tests._support import REPO_ROOT

GUIDE = REPO_ROOT / "docs" / "guides" / "workers-and-middleware.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```$", GUIDE.read_text(), flags=re.DOTALL | re.MULTILINE)

pytestmark = pytest.mark.timeout(120)


def test_the_guide_has_its_examples() -> None:
    assert len(BLOCKS) == 5


@pytest.mark.parametrize("number", range(len(BLOCKS)))
def test_each_python_block_runs(number: int) -> None:
    code = compile(BLOCKS[number], f"{GUIDE.name} block {number + 1}", "exec")
    exec(code, {"__name__": f"guide_block_{number + 1}"})
