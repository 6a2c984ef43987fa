"""Sphinx configuration of sqlqueue's documentation site: ``nox -s docs`` builds it.

Pages are MyST markdown; the reference is generated from the code (autodoc for the public
API, ``_ext/sqlqueue_reference.py`` for the CLI, the tables, the metrics, the log fields and
the error tree), so it cannot drift from it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

import sqlqueue  # noqa: E402

project = "sqlqueue"
author = "the sqlqueue authors"
copyright = "the sqlqueue authors"
release = version = sqlqueue.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sqlqueue_reference",
]

#: The command line's parser, as ``module:function`` returning an ``argparse.ArgumentParser``.
sqlqueue_cli_parser = "sqlqueue.cli:build_parser"

source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "screenshots", "README.md"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

html_theme = "furo"
html_title = f"sqlqueue {release}"

# Queue's operators' methods (stats, health, jobs, requeue …) come from a private base class:
# inherited members are documented on the public class, except those of Python's own bases.
autodoc_default_options = {
    "members": True,
    "show-inheritance": True,
    "inherited-members": ",".join(
        (
            *("Exception", "BaseException", "ValueError", "LookupError"),
            *("dict", "tuple", "str", "int", "Enum", "StrEnum", "object"),
        )
    ),
}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True

# Warnings are errors (-W) and every cross-reference must resolve (-n). Intersphinx to Python
# and SQLAlchemy needs their inventories from the network: SQLQUEUE_DOCS_INTERSPHINX=1 turns it
# on; without it (the default: builds here see loopback only) references to other projects'
# types are left as text, and only sqlqueue's own must resolve. Private types that public
# signatures mention (``sqlqueue._task.EnqueueOptions``) are shown as text: they have no page.
nitpicky = True
if os.environ.get("SQLQUEUE_DOCS_INTERSPHINX") == "1":
    intersphinx_mapping = {
        "python": ("https://docs.python.org/3", None),
        "sqlalchemy": ("https://docs.sqlalchemy.org/en/20/", None),
    }
    nitpick_ignore_regex = [(r"py:.*", r"(starlette|prometheus_client|opentelemetry)\..*")]
else:
    intersphinx_mapping = {}
    nitpick_ignore_regex = [(r"py:.*", r"(?!sqlqueue\b).*")]
# `nox -s docs` runs the linkcheck builder for the links between pages only: the builds here
# reach loopback only, so every URL outside the site is left alone.
linkcheck_ignore = [r"https?://"]
nitpick_ignore_regex.append((r"py:.*", r"sqlqueue\.(\w+\.)*_\w+(\.\w+)*"))
