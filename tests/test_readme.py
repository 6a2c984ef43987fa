"""The README stays a page a newcomer can read: short, its commands the ones CI runs, its links
alive (the rest of the documentation is the site in ``docs/``)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
SHELL_BLOCKS = re.findall(r"```sh\n(.*?)```", README, re.DOTALL)


def test_the_readme_fits_in_250_lines() -> None:
    assert len(README.splitlines()) <= 250


def test_ci_runs_the_readmes_test_command_verbatim() -> None:
    (command,) = [block.strip() for block in SHELL_BLOCKS if "python -m pytest" in block]
    assert command in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()


def test_every_relative_link_of_the_readme_and_changelog_exists() -> None:
    for name in ("README.md", "CHANGELOG.md"):
        text = (ROOT / name).read_text(encoding="utf-8")
        targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
        missing = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
        assert missing == [], f"{name} links to missing files: {missing}"
