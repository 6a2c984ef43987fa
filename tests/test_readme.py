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


CI_RUN = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()


def test_ci_runs_the_readmes_test_command_verbatim() -> None:
    (command,) = [block.strip() for block in SHELL_BLOCKS if "python -m pytest" in block]
    assert command in [line.strip() for line in CI_RUN]


def test_every_and_list_of_ci_runs_in_a_subshell_whose_failure_stops_the_script() -> None:
    """Under ``set -e`` a failing command before the last of an ``a && b`` list does not stop
    the script (a failed install would skip the tests and the run could still pass); the
    same list as a subshell's last command does, through the subshell's exit status."""
    assert "set -euo pipefail" in CI_RUN
    depth = 0
    outside = []
    for number, line in enumerate(CI_RUN, 1):
        code = line.split("#", 1)[0].strip()
        if code == "(":
            depth += 1
        elif code == ")":
            depth -= 1
        elif "&&" in code and depth == 0 and not code.startswith(("if ", "for ")):
            outside.append((number, code))
    assert outside == []


def test_every_relative_link_of_the_readme_and_changelog_exists() -> None:
    for name in ("README.md", "CHANGELOG.md"):
        text = (ROOT / name).read_text(encoding="utf-8")
        targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
        missing = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
        assert missing == [], f"{name} links to missing files: {missing}"
