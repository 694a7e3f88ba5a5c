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
                   "Install one, e.g. pip install ./packages/mizuoto-f5tts from a clone of "
                   "Mizuoto's repository")
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
@click.argument("model_id", required=False)
@click.option("--curl", is_flag=True, help="With MODEL_ID: print one curl command per missing file, to download them on a machine with a network (into a folder named after the model, to copy to $MIZUOTO_HOME/models/).")
def models(model_id, curl):
    """List catalog models and which are already downloaded; with MODEL_ID, each of its files:
    its repository, URL, where it goes and whether it is there."""
    from mizuoto.catalog import downloaded_files
    from mizuoto.registry import catalog

    entries = catalog()
    if not entries:
        click.echo("No catalog entries: no engine is installed.")
        return
    if model_id is not None:
        _model_files(entries, model_id, curl=curl)
        return
    if curl:
        raise click.UsageError("--curl needs a MODEL_ID (see `mizuoto models`)")
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
    click.echo("`mizuoto models ID` names a model's files, their URLs and where they go.")


def _model_files(entries, model_id: str, *, curl: bool) -> None:
    """``mizuoto models ID``: every file of a catalog model, found or not, with its source."""
    import shlex

    from mizuoto.catalog import downloaded_files, hub_url, model_cache_dir
    from mizuoto.errors import ModelNotFound

    entry = entries.get(model_id)
    if entry is None:
        import difflib

        near = difflib.get_close_matches(model_id, list(entries), 1, 0.6)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise ModelNotFound(f"{model_id!r} is not a catalog id{hint}; known ids: "
                            f"{', '.join(sorted(entries))}")
    directory = model_cache_dir(entry)
    files = downloaded_files(entry)
    if curl:
        folder = directory.name
        for name, found in files.items():
            if found is None:
                click.echo(f"curl -L --create-dirs -o {shlex.quote(f'{folder}/{name}')} "
                           f"{shlex.quote(hub_url(entry.files[name]))}")
        return
    have = sum(1 for found in files.values() if found is not None)
    click.echo(f"{entry.id}: {have} of {len(files)} files here; the model directory is "
               f"{directory}")
    for name, found in files.items():
        hub_file = entry.files[name]
        if found is not None:
            state = f"found: {found[1]}"
        elif name in entry.optional:
            state = "missing (optional: the engine brings its own)"
        else:
            state = "missing"
        click.echo(f"  {name}  {state}")
        click.echo(f"    repository {hub_file.repo}, file {hub_file.filename}"
                   + (f", revision {hub_file.revision}" if hub_file.revision else ""))
        click.echo(f"    {hub_url(hub_file)}")
        click.echo(f"    goes to {directory / name}")
    if have < len(files):
        click.echo(f"Offline: `mizuoto models {entry.id} --curl` prints the downloads to run "
                   "elsewhere; copy the folder they fill to "
                   f"{directory.parent}/ (or a Hugging Face cache to its place, or pass any "
                   "folder with this layout as -m); see docs/weights.md.")


COMMANDS = (plugins, models)
