"""The Mizuoto contract suite: the same tests against every installed engine's models.

An engine plugin registers small random-init model recipes with the
``register_contract_fixtures`` hook; this suite writes each one, loads it with its engine and
checks the engine contract (determinism, seeds, errors, and each declared capability).

Run it against your own plugin::

    pytest --pyargs mizuoto_contract --mizuoto-engine NAME

or, from Python, ``mizuoto_contract.run(["NAME"])`` (``python -m mizuoto_contract NAME``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence


def run(engines: Sequence[str] = (), pytest_args: Sequence[str] = ()) -> int:
    """Run the suite (against ``engines``, default all installed); returns pytest's exit code."""
    import pytest

    # This package is imported before pytest starts, so pytest cannot rewrite its asserts and
    # says so; the test module itself is imported later and is rewritten.
    args = ["--pyargs", "mizuoto_contract", "-W", "ignore::pytest.PytestAssertRewriteWarning"]
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        args += ["-p", "mizuoto_contract.plugin"]
    args += [f"--mizuoto-engine={name}" for name in engines]
    return int(pytest.main([*args, *pytest_args]))


__all__ = ["run"]
