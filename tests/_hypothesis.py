"""Hypothesis profiles: "ci" (the default, a few seconds per backend) and "long" (the nox
session ``hypothesis``: ``HYPOTHESIS_PROFILE=long``). Property tests carry no ``@settings`` of
their own, so the active profile decides how many examples they try."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_SUPPRESSED = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]

settings.register_profile("ci", max_examples=25, deadline=None, suppress_health_check=_SUPPRESSED)
settings.register_profile(
    "long", max_examples=1000, deadline=None, suppress_health_check=_SUPPRESSED
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
