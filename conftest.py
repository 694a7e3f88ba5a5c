"""Hypothesis profiles shared by every package's property tests (``test_fuzz_*.py``).

``MIZUOTO_HYPOTHESIS_PROFILE`` picks one: ``ci`` (default: a bounded, derandomized run, the
same examples every time, no example database) or ``fuzz`` (``nox -s fuzz``: twenty times the
examples, random, failures remembered in ``.hypothesis/``). Tests whose examples are costly
take a fraction of the profile's ``max_examples`` (``settings.default.max_examples``), so both
profiles scale them.
"""

from __future__ import annotations

import os

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # hypothesis is in the `test` extra; without it the fuzz tests are skipped
    settings = None

if settings is not None:
    _QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
    settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True,
                              database=None, print_blob=True, suppress_health_check=_QUIET)
    settings.register_profile("fuzz", max_examples=800, deadline=None, print_blob=True,
                              suppress_health_check=_QUIET)
    settings.load_profile(os.environ.get("MIZUOTO_HYPOTHESIS_PROFILE", "ci"))
