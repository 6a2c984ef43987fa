"""The Hypothesis profiles of the property tests, loaded by ``tests/conftest.py``.

``ci`` (the default) keeps the default suite quick: few examples, no deadline (a property that
drives a real worker on a real database takes far longer than Hypothesis's 200 ms, and this
machine is shared). ``long`` runs many more: ``nox -s hypothesis`` sets
``HYPOTHESIS_PROFILE=long``. A profile another module registers under another name is left
alone; these two are only registered here.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

#: Checks that do not fit a property over a real database: the ``backend`` fixture is made
#: once per test, not per example (each example adds its own jobs), and examples are slow.
_SUPPRESSED = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]

settings.register_profile("ci", max_examples=15, deadline=None, suppress_health_check=_SUPPRESSED)
settings.register_profile(
    "long", max_examples=500, deadline=None, suppress_health_check=_SUPPRESSED
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
