"""Mizuoto's plugin hooks. Each receives a ``register`` callback; a plugin calls it once per thing.

A plugin is a module with ``@hookimpl`` functions, published under the ``mizuoto`` entry-point
group. See ``docs/plugins.md``.
"""

from pluggy import HookimplMarker, HookspecMarker

hookspec = HookspecMarker("mizuoto")
hookimpl = HookimplMarker("mizuoto")


@hookspec
def register_engines(register):
    """Register engine classes: ``register(EngineSubclass)``."""


@hookspec
def register_trainers(register):
    """Register trainer classes: ``register(TrainerSubclass)``."""


@hookspec
def register_models(register):
    """Register catalog entries: ``register(CatalogEntry(...))`` maps a model id to its files."""


@hookspec
def register_contract_fixtures(register):
    """Register small random-init model recipes: ``register(ContractFixture(...))``."""


@hookspec
def register_upstream_baselines(register):
    """Register the upstream packages engines reproduce: ``register(UpstreamBaseline(...))``."""


@hookspec
def register_commands(cli):
    """Add commands to the ``mizuoto`` command line: ``@cli.command()`` or ``cli.add_command``."""
