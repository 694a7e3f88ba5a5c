"""``mizuoto wyoming``: serve models to Home Assistant over the Wyoming protocol."""

from __future__ import annotations

from pathlib import Path

import click

from mizuoto.commands.toolkit import options_to_load, server_options
from mizuoto.errors import InvalidRequest


@click.command()
@server_options(port=10200, unauthenticated=True, queue_full="an error")
@click.option("--max-connections", default=32, show_default=True, type=int, help="Clients connected at once.")
@click.option("--seed", type=int, help="Seed of every synthesis (same text and voice: same audio); default: each draws one.")
@click.option("--steps", type=int, help="Sampling steps of every synthesis (default: the engine's).")
@click.option("--language", "languages", multiple=True, help="Language to announce (repeatable; default: the engine's).")
@click.option("--voices-dir", type=click.Path(file_okay=False), help="Saved voices (default: $MIZUOTO_HOME/voices, as mizuoto serve).")
@click.option("--zeroconf", is_flag=True, help="Announce the server to Home Assistant on the network (needs zeroconf).")
@click.option("--idle-timeout", default=60.0, show_default=True, type=float, help="Seconds a connection may send no event before it is closed.")
@click.option("--write-timeout", default=10.0, show_default=True, type=float, help="Seconds a client may take none of its audio before it is disconnected (its synthesis stops).")
def wyoming(models, aliases, engine, host, port, queue_size, max_connections, seed, steps,
            languages, voices_dir, zeroconf, idle_timeout, write_timeout, option_pairs,
            options_file):
    """Serve models to Home Assistant over the Wyoming protocol (docs/home-assistant.md)."""
    import importlib

    try:
        from mizuoto.serve.app import ServeConfig, model_names
        from mizuoto.wyoming.server import WyomingConfig, run

        importlib.import_module("wyoming.server")
    except ImportError as exc:
        raise click.ClickException(f"mizuoto wyoming needs the wyoming extra ({exc.name} is "
                                   "missing): pip install \"mizuoto-core[wyoming]\"") from None
    if zeroconf:
        try:
            importlib.import_module("zeroconf.asyncio")
        except ImportError:
            raise click.ClickException(
                "--zeroconf needs the zeroconf package, which is not installed: pip install "
                "\"mizuoto-core[wyoming]\" (or pip install zeroconf), or leave --zeroconf off "
                "and add the server in Home Assistant by host and port") from None
    names = model_names(models, aliases)
    options = options_to_load(options_file, option_pairs, serving=True)
    from mizuoto.wyoming.frames import FrameLimits

    try:
        frames = FrameLimits(idle=idle_timeout)
        config = WyomingConfig(ServeConfig(
            models=names, engine=engine, host=host, port=port, queue_size=queue_size,
            options=options, voices_dir=Path(voices_dir) if voices_dir else None),
            max_connections=max_connections, seed=seed, steps=steps, languages=languages,
            zeroconf=zeroconf, frames=frames, write_timeout=write_timeout)
    except InvalidRequest as exc:  # named as the user wrote it
        raise InvalidRequest("--" + exc.field.replace("_", "-"), exc.problem, exc.fix) \
            from None
    run(config)


COMMANDS = (wyoming,)
