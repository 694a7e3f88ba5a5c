"""``mizuoto random-model``: write a random-init model (a contract fixture) to a directory."""

from __future__ import annotations

import os
from pathlib import Path

import click

from mizuoto.errors import InvalidRequest


class _FixtureListCommand(click.Command):
    """Lists the installed random-init models (contract fixtures) at the end of its
    ``--help``."""

    def format_epilog(self, ctx, formatter):
        from mizuoto.registry import random_models

        fixtures = random_models()
        with formatter.section("Random-init models"):
            if not fixtures:
                formatter.write_text("none: no engine is installed (pip install "
                                     "./packages/mizuoto-f5tts from a clone of Mizuoto's "
                                     "repository)")
            formatter.write_dl([(fid, fixture.description or "")
                                for fid, fixture in sorted(fixtures.items())])


@click.command(name="random-model", cls=_FixtureListCommand)
@click.argument("fixture")
@click.argument("directory", type=click.Path(file_okay=False))
def random_model(fixture, directory):
    """Write the random-init model FIXTURE (e.g. f5tts/tiny-v1-base) to DIRECTORY.

    Most of these models have random weights: such a model speaks noise, not speech. They exist
    so that plugin authors, tests and offline demos can run the whole synthesis path without
    any download. The installed ones are listed below. DIRECTORY must be new, empty or an
    earlier write of the same fixture (a directory holding other files is refused).
    """
    from mizuoto.registry import random_models

    fixtures = random_models()
    if not fixtures:
        raise InvalidRequest("FIXTURE", f"{fixture!r}: no engine is installed, so there are no "
                             "random-init models", "pip install ./packages/mizuoto-f5tts (or "
                             "./packages/mizuoto-voxcpm) from a clone of Mizuoto's repository, then see mizuoto random-model --help")
    if fixture not in fixtures:
        known = ", ".join(sorted(fixtures))
        raise InvalidRequest("FIXTURE", f"unknown random-init model {fixture!r}",
                             f"known: {known}")
    from mizuoto.output_paths import check_output_dir

    if not directory.strip():  # "" would be the current directory
        raise InvalidRequest("DIRECTORY", "is empty", "name the directory to write the model in")
    path = check_output_dir(directory, "DIRECTORY")
    path.mkdir(parents=True, exist_ok=True)
    _write_fixture(fixtures[fixture], path)
    note = " (random weights: noise, not speech)" if fixtures[fixture].random_init else ""
    click.echo(f"Wrote {fixture} to {path}{note}", err=True)


def _write_fixture(fixture, path: Path) -> None:
    """Write ``fixture`` beside ``path``, then move its files in: a directory holding anything
    but the files this model writes (a rerun) is refused, never mixed with a model's files (two
    checkpoints, or files another engine recognizes, in one model directory)."""
    import shutil
    import tempfile

    staging = Path(tempfile.mkdtemp(prefix=".random-model-", dir=path.parent))
    try:
        fixture.make(staging)
        if fixture.random_init:
            from mizuoto.contracts.fixtures import mark_random_init

            mark_random_init(staging, fixture.id)
        extra = sorted(item.name for item in path.iterdir() if not (staging / item.name).exists())
        if extra:
            raise InvalidRequest("DIRECTORY", f"{path} holds files this model does not write "
                                 f"({', '.join(extra[:5])}{', ...' if len(extra) > 5 else ''})",
                                 "name a new or empty directory")
        for item in staging.iterdir():
            target = path / item.name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.replace(item, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


COMMANDS = (random_model,)
