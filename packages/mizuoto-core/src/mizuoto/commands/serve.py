"""``mizuoto serve``: the OpenAI-compatible speech API, in this process or on Ray Serve."""

from __future__ import annotations

import os

import click

from mizuoto.commands.toolkit import options_to_load, server_options
from mizuoto.errors import InvalidRequest


@click.command()
@server_options(port=8000)
@click.option("--api-key", envvar="MIZUOTO_API_KEY", help="Require Authorization: Bearer KEY on every path but /health (env MIZUOTO_API_KEY; an empty key is refused).")
@click.option("--grace", default=30.0, show_default=True, type=float, help="Seconds in-flight requests get to finish on shutdown (0 to 3600).")
@click.option("--max-loaded", type=int, help="Models kept loaded at once (least recently used unloaded; default: all).")
@click.option("--memory-budget", metavar="SIZE", help="Weights kept loaded at most, e.g. 8G or 500M (least recently used unloaded).")
@click.option("--max-batch", default=1, show_default=True, type=int, help="Requests of one model run at once, 1 to 256; an engine that batches (VoxCPM streams) steps them together. Batched audio is close to, not always bit-identical with, unbatched (docs/performance.md).")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME", help="Also answer requests whose Host is NAME (repeatable; a reverse proxy's public name; '*': any). Loopback names and --host are always answered.")
@click.option("--allowed-origin", "allowed_origins", multiple=True, metavar="ORIGIN", help="Also take state-changing requests from web pages at ORIGIN, e.g. https://app.example.com (repeatable; the server's own page always may).")
@click.option("--max-voices", default=100, show_default=True, type=int, help="Voices stored at most (more: 409).")
@click.option("--max-voices-size", default="512M", show_default=True, metavar="SIZE", help="Bytes of stored voices at most, e.g. 512M or 2G (more: 409).")
@click.option("--header-timeout", default=10.0, show_default=True, type=float, help="Seconds a request's headers may take (slower: 408 and closed; a connection that sends nothing is closed).")
@click.option("--keep-alive", default=5.0, show_default=True, type=float, help="Seconds an idle connection stays open between requests.")
@click.option("--max-client-chars", default=16384, show_default=True, type=int, help="Characters of text one client (its API key, else its address) may have being spoken at once (more: 429).")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]", help="Serve on Ray Serve (mizuoto-core[ray]): a local instance, or the cluster at ADDRESS (docs/serve.md, Scaling out).")
@click.option("--replicas", type=int, default=1, show_default=True, help="With --ray: replicas per model.")
@click.option("--min-replicas", type=int, help="With --ray: autoscale each model from this many replicas (with --max-replicas).")
@click.option("--max-replicas", type=int, help="With --ray: autoscale each model up to this many replicas.")
@click.option("--target-ongoing", type=float, default=1.0, show_default=True, help="With --ray and autoscaling: requests per replica to aim at.")
@click.option("--num-cpus", type=float, default=1.0, show_default=True, help="With --ray: CPUs each model replica reserves (fractions allowed).")
@click.option("--num-gpus", type=float, default=0.0, show_default=True, help="With --ray: GPUs each model replica reserves (fractions allowed).")
@click.option("--ingress-replicas", type=int, default=1, show_default=True, help="With --ray: HTTP ingress replicas (more than one on several nodes: share the voices directory).")
@click.option("--lora-dir", "lora_dirs", multiple=True, type=click.Path(exists=True, file_okay=False), help="A directory of LoRA exports (mizuoto train --method lora, any engine's), each served as a model named by its subdirectory, on the served base model it names (repeatable).")
@click.option("--max-adapters", type=int, default=4, show_default=True, help="With --ray: LoRA exports loaded at once per replica (least recently used unloaded).")
@click.pass_context
def serve(ctx, models, aliases, engine, host, port, api_key, queue_size, grace, max_loaded,
          memory_budget, max_batch, allowed_hosts, allowed_origins, max_voices, max_voices_size,
          option_pairs, options_file, ray_address=None, replicas=1, min_replicas=None,
          max_replicas=None, target_ongoing=1.0, num_cpus=1.0, num_gpus=0.0,
          ingress_replicas=1, lora_dirs=(), max_adapters=4, header_timeout=10.0,
          keep_alive=5.0, max_client_chars=16384):
    """Serve models over an OpenAI-compatible speech API (docs/serve.md)."""
    try:
        from mizuoto.serve.app import ServeConfig, model_names, run
        from mizuoto.serve.page import page_url
    except ImportError as exc:
        raise click.ClickException(f"mizuoto serve needs the serve extra ({exc.name} is "
                                   "missing): pip install \"mizuoto-core[serve]\"") from None
    from_env = ctx.get_parameter_source("api_key") is click.core.ParameterSource.ENVIRONMENT
    if api_key is None and "MIZUOTO_API_KEY" in os.environ:
        # click reads an empty variable as unset: here it must not mean "no authentication"
        api_key, from_env = os.environ["MIZUOTO_API_KEY"], True
    names, budget = model_names(models, aliases), _size(memory_budget)
    voices_bytes = _size(max_voices_size, "--max-voices-size")
    options = options_to_load(options_file, option_pairs, serving=True)
    try:
        config = ServeConfig(models=names, engine=engine, host=host, port=port,
                             api_key=api_key, queue_size=queue_size, grace=grace,
                             max_loaded=max_loaded, memory_budget=budget, options=options,
                             max_batch=max_batch, allowed_hosts=allowed_hosts,
                             allowed_origins=allowed_origins, max_voices=max_voices,
                             max_voices_bytes=voices_bytes, header_timeout=header_timeout,
                             keep_alive=keep_alive, max_client_chars=max_client_chars,
                             # under --ray the adapters are the Ray deployment's
                             lora_dirs=() if ray_address else lora_dirs)
    except InvalidRequest as exc:  # named as the user wrote it
        option = "MIZUOTO_API_KEY" if exc.field == "api_key" and from_env else \
            "--" + {"max_voices_bytes": "max_voices_size", "lora_dirs": "lora_dir"}.get(
                exc.field, exc.field).replace("_", "-")
        raise InvalidRequest(option, exc.problem, exc.fix) from None
    ray_settings = None
    if ray_address:
        ray_settings = _ray_settings(ray_address, replicas=replicas, min_replicas=min_replicas,
                                     max_replicas=max_replicas, target_ongoing=target_ongoing,
                                     num_cpus=num_cpus, num_gpus=num_gpus,
                                     ingress_replicas=ingress_replicas, lora_dirs=lora_dirs,
                                     max_adapters=max_adapters)
    click.echo(f"Listen in a browser: {page_url(host, port)} (the API is under /v1)")
    if ray_settings is not None:
        from mizuoto.serve.ray import run as run_on_ray

        try:
            run_on_ray(config, ray_settings)
        except InvalidRequest as exc:  # e.g. more replicas than the cluster can place
            raise _named_by_flag(exc) from None
        return
    try:
        run(config)
    except InvalidRequest as exc:  # the exports under --lora-dir, found as the server starts
        if exc.field != "lora_dirs":
            raise
        raise _named_by_flag(exc) from None


def _ray_settings(address: str, **settings):
    """``mizuoto serve --ray``'s settings, a bad one named by its flag."""
    try:
        import ray.serve  # noqa: F401

        from mizuoto.serve.ray import RaySettings
    except ImportError as exc:
        raise click.ClickException(f"mizuoto serve --ray needs the ray extra ({exc.name} is "
                                   "missing): pip install \"mizuoto-core[ray]\"") from None
    try:
        return RaySettings(None if address == "local" else address, **settings)
    except InvalidRequest as exc:
        raise _named_by_flag(exc) from None


def _named_by_flag(exc: InvalidRequest) -> InvalidRequest:
    """A :class:`~mizuoto.serve.ray.RaySettings` field's error, named by its flag."""
    if exc.field.startswith("-"):
        return exc
    flag = {"lora_dirs": "lora_dir"}.get(exc.field, exc.field)
    return InvalidRequest("--" + flag.replace("_", "-"), exc.problem, exc.fix)


def _size(text, option="--memory-budget"):
    """Bytes from ``8G``, ``500M``, ``64K`` or a plain number; None stays None."""
    if text is None:
        return None
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    number, unit = text.strip().upper().removesuffix("B"), 1
    if number[-1:] in units:
        number, unit = number[:-1], units[number[-1]]
    try:
        value = float(number)
    except ValueError:
        raise InvalidRequest(option, f"{text!r} is not a size", "e.g. 8G or 500M") \
            from None
    if not 0 < value < float("inf"):
        raise InvalidRequest(option, f"{text!r} must be a positive size")
    return int(value * unit)


COMMANDS = (serve,)
