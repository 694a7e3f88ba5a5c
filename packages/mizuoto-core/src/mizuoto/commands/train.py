"""``mizuoto train``: fine-tune a model with its engine's trainer (prepare, train, export),
resumably; a run stopped by a signal says how to resume it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from mizuoto.command_options import command_options
from mizuoto.commands.toolkit import command_progress
from mizuoto.options import ComputeOptions


def _training_settings(command):
    """The ``train`` options of `TrainingConfig`'s settings (`training_settings`: each declared
    once there, with its default and check; None here: the recipe's value applies)."""
    from mizuoto.contracts.trainer import training_settings

    for setting in reversed(training_settings()):
        kind = click.Choice(setting.kind) if isinstance(setting.kind, tuple) else setting.kind
        command = click.option(setting.flag, setting.name, type=kind, default=None,
                               help=setting.help)(command)
    return command


_DATA_HELP = ("The data set: a metadata.csv (upstream F5-TTS's layout: header audio_file|text, "
              "one clip per line, paths relative to the file), a JSONL manifest (one "
              '{"audio": PATH, "text": ...} object per line), or a folder holding one; a folder '
              "may hold a train manifest and a validation one (train*.jsonl, val*.jsonl).")


@click.command()
@click.option("-e", "--engine", required=True, help="Engine whose trainer runs (f5tts, voxcpm, ...).")
@click.option("--method", default=None, help="full or lora (default: the --config file's, else full).")
@click.option("-m", "--model", help="Model to fine-tune: a catalog id or a model directory (default: the --config file's).")
@click.option("--data", "dataset", type=click.Path(exists=True), help=_DATA_HELP)
@click.option("--output", "output_dir", required=True, type=click.Path(file_okay=False), help="Run directory: checkpoints, metrics, recipe.json, export/ (a run there resumes).")
@_training_settings
@click.option("--option", "option_pairs", multiple=True, metavar="KEY=VALUE", help="compute.* option such as compute.device=cuda:1 (repeatable).")
@click.option("--param", "param_pairs", multiple=True, metavar="KEY=VALUE", help="A recipe setting (repeatable), e.g. grad_accum_steps=4 or lora_r=16; values are TOML (true, 1e-4, [\"a\", \"b\"]). Unknown keys are refused by name.")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False), help="Recipe file: TOML of the same keys, or upstream's own (VoxCPM conf/*.yaml; F5-TTS finetune_cli flag names).")
@click.pass_context
def train(ctx, engine, method, model, dataset, output_dir, option_pairs, param_pairs, config_file,
          **settings):
    """Fine-tune a model with the engine's trainer (prepare, train, export).

    The recipe starts from upstream's defaults for the engine, method and model; a --config
    file, then --param pairs, then the options above override them. The effective recipe is
    printed at the start and stored as recipe.json in the run directory.
    """
    from mizuoto.runtime.startup import set_wait_policy

    compute = command_options(None, option_pairs).compute if option_pairs else None
    # OpenMP's wait policy before the training code imports torch (auto: passive on a busy
    # machine)
    set_wait_policy(compute or ComputeOptions(), serving=False)
    from mizuoto.registry import get_trainer
    from mizuoto.training.recipe import recipe_text, training_config

    trainer = get_trainer(engine)()
    explicit = {**settings, "compute": compute}
    config = training_config(trainer, method=method, model=model, dataset=dataset,
                             output_dir=output_dir, config_file=config_file,
                             param_pairs=param_pairs, explicit=explicit)
    trainer.check(config)
    with command_progress(ctx.obj["quiet"]) as progress:
        run = trainer.prepare(config, progress=progress)
        recipe = Path(output_dir) / "recipe.json"
        if recipe.is_file() and os.environ.get("RANK", "0") == "0":
            click.echo(f"Recipe ({recipe}):\n{recipe_text(json.loads(recipe.read_text()))}",
                       err=True)
        result = trainer.train(run, progress=progress)
        if result.interrupted is None:
            exported = trainer.export(run, Path(output_dir) / "export")
    if result.interrupted is not None:
        _stopped_training(ctx, result, _resume_command(ctx.params))
    click.echo(f"{_trained(result)}; exported {exported}", err=True)


def _trained(result) -> str:
    """What this run trained: all its steps, the ones after a resumed checkpoint, or none
    (a rerun of a finished run only exports again)."""
    start = result.resumed_from or 0
    if result.steps_done <= start:
        return (f"Nothing to train: the run in {result.output_dir} already finished its "
                f"{result.steps_done} steps")
    if start:
        return (f"Trained steps {start + 1} to {result.steps_done} (resumed after step "
                f"{start})")
    return f"Trained {result.steps_done} steps"


def _resume_command(params: dict) -> str:
    """The ``mizuoto train`` command line that continues a run (the same options, as given);
    under torchrun, with as many processes."""
    import shlex

    from mizuoto.contracts.trainer import training_settings

    words = ["mizuoto", "train"]
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    if processes > 1:
        words = ["torchrun", "--nproc_per_node", str(processes), "-m", *words]
    for option, key in (("-e", "engine"), ("--method", "method"), ("-m", "model"),
                        ("--data", "dataset"), ("--output", "output_dir"),
                        *((s.flag, s.name) for s in training_settings()),
                        ("--config", "config_file")):
        if params.get(key) is not None:
            words += [option, str(params[key])]
    for flag, key in (("--option", "option_pairs"), ("--param", "param_pairs")):
        for pair in params.get(key) or ():
            words += [flag, pair]
    return shlex.join(words)


def _stopped_training(ctx, result, command: str) -> None:
    """Say where a run stopped by a signal stands and how to resume it; exit as a process
    ended by that signal (130 SIGINT, 143 SIGTERM). Under torchrun, process 0 says it."""
    from mizuoto.runtime.interruption import exit_status

    if os.environ.get("RANK", "0") == "0":
        click.echo(f"Stopped by {result.interrupted} after step {result.steps_done}; the "
                   f"checkpoint is saved in {result.output_dir} (not exported). To resume:\n"
                   f"  {command}", err=True)
    ctx.exit(exit_status(result.interrupted))


COMMANDS = (train,)
