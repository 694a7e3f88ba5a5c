"""``mizuoto plugins`` and ``mizuoto models``: what is installed, and which catalog models are
downloaded. Neither imports an engine: listing stays fast."""

from __future__ import annotations

import click

#: What each hook gives a user, as `mizuoto plugins` lists it.
_PLUGIN_FEATURES = {
    "register_engines": "engines",
    "register_trainers": "training (mizuoto train)",
    "register_models": "catalog models (mizuoto models)",
    "register_contract_fixtures": "random-init models (mizuoto random-model)",
    "register_upstream_baselines": "upstream speed baselines (mizuoto bench)",
    "register_commands": "commands",
}


@click.command()
def plugins():
    """List installed plugins, their versions and what they provide."""
    from mizuoto.plugins import get_plugins
    from mizuoto.registry import engine_refs

    found = get_plugins()
    if not found:
        click.echo("No plugins installed: no engine is available. "
                   "Install one, e.g. pip install mizuoto-f5tts")
        return
    for plugin in found:
        version = plugin["version"] or "?"
        dist = plugin["distribution"] or plugin["name"]
        click.echo(f"{plugin['name']}  ({dist} {version})")
        features = [_PLUGIN_FEATURES.get(hook, hook) for hook in plugin["hooks"]]
        click.echo(f"  provides: {', '.join(features) or '-'}")
        for error in plugin.get("errors", []):
            click.echo(f"  error: {error}")
    refs = engine_refs()  # the engines are not imported: listing them stays fast
    if not refs:
        click.echo("No engines registered.")
        return
    click.echo(f"engines: {', '.join(sorted(refs))}")
    for name, ref in sorted(refs.items()):
        if ref.capabilities:
            capabilities = ", ".join(sorted(c.value for c in ref.capabilities))
            click.echo(f"  {name}: {capabilities}")


@click.command()
def models():
    """List catalog models and which are already downloaded."""
    from mizuoto.catalog import downloaded_files
    from mizuoto.registry import catalog

    entries = catalog()
    if not entries:
        click.echo("No catalog entries: no engine is installed.")
        return
    for model_id, entry in sorted(entries.items()):
        files = downloaded_files(entry)
        have = sum(1 for found in files.values() if found is not None)
        needed = len(files)
        if not needed:
            state = "no files"  # nothing to download: the engine needs no weights
        else:
            state = "downloaded" if have == needed else f"{have}/{needed} files"
        license_note = entry.license + (" (non-commercial)" if entry.non_commercial else "")
        click.echo(f"{model_id:<20} {state:<12} {license_note:<28} {entry.description}")


COMMANDS = (plugins, models)
