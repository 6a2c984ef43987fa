"""The database drivers, imported once, before any test runs.

pytest's ``pytester`` fixture (``tests/test_testing.py``) puts ``sys.modules`` back as it was
after each of its tests. A driver first imported during such a test (a session fixture's
database made there) was imported again afterwards, while psycopg's compiled part kept its
first copy's exception classes: ``except psycopg.Error`` (SQLAlchemy's, sqlqueue's) then
missed what the driver raised, and an unreachable server raised a bare ``OperationalError``.
Imported here, in the snapshot every such test takes, a driver is never imported twice.
"""

from __future__ import annotations

import contextlib
import importlib

for _driver in ("psycopg", "pymysql"):
    with contextlib.suppress(ImportError):  # an extra not installed: its tests skip
        importlib.import_module(_driver)
