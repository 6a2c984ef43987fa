"""The fault-injection suite (issue 5): real worker processes, real PostgreSQL, real SQLite
files, and faults injected from the test side — SIGKILL, SIGSTOP, terminated backends, a
refusing database, hung handlers, poison jobs, skewed clocks, racing enqueuers and claims.

Every verdict is counted from data: the handlers' autocommitted ledger (``fault_ledger``), an
audit trigger on the job table (``fault_transitions``) and the job rows; every test prints its
figure. ``pytest tests/faults`` runs the CI size; ``pytest -m slow tests/faults`` (or
``nox -s slow``) the soak, 20 times bigger. The worker side lives in ``tests/apps/fault_*.py``.
"""
