"""Hypothesis profiles for the property tests of every Mizuoto package (``test_fuzz_*.py``, the
contract suite's hostile-input tests), loaded by the contract suite's pytest plugin.

``MIZUOTO_HYPOTHESIS_PROFILE`` picks one: ``ci`` (default: bounded and derandomized, the same
examples every run, no example database) or ``fuzz`` (``nox -s fuzz``: twenty times the
examples, random, failures kept in ``.hypothesis/`` and replayed first). Tests whose examples
are costly take a fraction of ``settings.default.max_examples``, so both profiles scale them.
Imports only Hypothesis (no torch, no mizuoto): loading it is cheap for any test run.
"""

from __future__ import annotations

import os

PROFILES = ("ci", "fuzz")


def load_profile() -> str:
    """Register both profiles and load the one ``MIZUOTO_HYPOTHESIS_PROFILE`` names."""
    from hypothesis import HealthCheck, settings

    quiet = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
    settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True,
                              database=None, print_blob=True, suppress_health_check=quiet)
    settings.register_profile("fuzz", max_examples=800, deadline=None, print_blob=True,
                              suppress_health_check=quiet)
    name = os.environ.get("MIZUOTO_HYPOTHESIS_PROFILE", "ci")
    if name not in PROFILES:
        raise ValueError(f"MIZUOTO_HYPOTHESIS_PROFILE={name!r}: use one of {', '.join(PROFILES)}")
    settings.load_profile(name)
    return name
