"""The docs keep up with the code (as datasette's test_docs does).

Every hookspec in :mod:`mizuoto.hookspecs` has a ``### `name(args)` `` heading in
``docs/plugins.md`` with its exact signature, and every name in ``mizuoto.__all__`` is listed
in ``docs/api.md``.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import mizuoto
from mizuoto import hookspecs

DOCS = Path(__file__).resolve().parents[3] / "docs"
_HOOK_HEADING = re.compile(r"^###\s+`(?P<name>\w+)\((?P<args>[^)]*)\)`\s*$", re.MULTILINE)


def _hookspecs() -> dict[str, str]:
    """Each hookspec's name and its signature as written in the docs: ``name(a, b)``."""
    return {
        name: f"{name}({', '.join(inspect.signature(function).parameters)})"
        for name, function in inspect.getmembers(hookspecs, inspect.isfunction)
        if hasattr(function, "mizuoto_spec")
    }


def _documented_hooks() -> dict[str, str]:
    text = (DOCS / "plugins.md").read_text()
    return {m["name"]: f"{m['name']}({m['args']})" for m in _HOOK_HEADING.finditer(text)}


def test_there_are_hookspecs_to_check():
    assert len(_hookspecs()) == 6


@pytest.mark.parametrize("name", sorted(_hookspecs()))
def test_hook_is_documented_with_its_signature(name):
    documented = _documented_hooks()
    signature = _hookspecs()[name]
    assert name in documented, f"docs/plugins.md has no heading ### `{signature}`"
    assert documented[name] == signature, (
        f"docs/plugins.md documents {documented[name]}, but the hookspec is {signature}")


def test_no_documented_hook_is_missing_from_the_code():
    assert set(_documented_hooks()) <= set(_hookspecs())


@pytest.mark.parametrize("name", sorted(mizuoto.__all__))
def test_public_name_is_in_the_api_docs(name):
    text = (DOCS / "api.md").read_text()
    assert re.search(rf"`{re.escape(name)}[`(]", text), f"docs/api.md does not list `{name}`"


def _commands():
    """Every visible ``mizuoto`` command, plugin commands included: (name, command)."""
    import click

    from mizuoto.cli import cli

    context = click.Context(cli)
    return [(name, cli.get_command(context, name)) for name in cli.list_commands(context)
            if not cli.get_command(context, name).hidden]


def test_there_are_commands_to_check():
    names = [name for name, _ in _commands()]
    assert {"say", "edit", "batch", "train", "serve", "bench", "random-model"} <= set(names)


@pytest.mark.parametrize("name", [name for name, _ in _commands()])
def test_every_command_and_option_has_help(name):
    import click

    command = dict(_commands())[name]
    assert (command.help or "").strip(), f"`mizuoto {name}` has no help text"
    bare = [parameter.opts[-1] for parameter in command.params
            if isinstance(parameter, click.Option) and not parameter.hidden
            and not (parameter.help or "").strip()]
    assert not bare, f"`mizuoto {name}`: no help text for {', '.join(bare)}"


def test_aliases_are_hidden_from_help():
    from click.testing import CliRunner

    from mizuoto.cli import cli

    listing = CliRunner().invoke(cli, ["--help"], obj={}).output
    assert "  say " in listing and "synth" not in listing
    # the alias still runs, as `say`
    assert "Speak TEXT" in CliRunner().invoke(cli, ["synth", "--help"], obj={}).output


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + len(heading) + 2)
    return text[start:end if end != -1 else len(text)]


def _python_blocks(section: str) -> list[str]:
    """The ```python blocks at the start of a line (not those inside list items)."""
    return re.findall(r"^```python\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)


_TRAINER_BLOCKS = _python_blocks(_section((DOCS / "plugins.md").read_text(),
                                          "## The trainer contract"))


def test_the_example_trainer_is_as_short_as_the_docs_say():
    """plugins.md offers the example plugin's trainer as the template, naming its length."""
    said = re.search(r"mizuoto_example/training\.py`,\s+(\d+) lines",
                     (DOCS / "plugins.md").read_text())
    assert said, "plugins.md no longer names the example trainer's length"
    trainer = DOCS / "examples/mizuoto-example/src/mizuoto_example/training.py"
    lines = len(trainer.read_text().splitlines())
    assert lines <= int(said[1]), f"{trainer.name} has {lines} lines, the docs say {said[1]}"


def test_the_trainer_docs_have_code_blocks():
    assert len(_TRAINER_BLOCKS) >= 3


@pytest.mark.parametrize("block", _TRAINER_BLOCKS,
                         ids=[f"block{i}" for i in range(len(_TRAINER_BLOCKS))])
def test_trainer_docs_code_blocks_run(block, tmp_path, monkeypatch):
    """A block that imports what it uses runs (in a scratch folder, its asserts checked);
    a sketch (a class skeleton) must at least parse."""
    import ast

    tree = ast.parse(block)
    if not isinstance(tree.body[0], (ast.Import, ast.ImportFrom)):
        return
    monkeypatch.chdir(tmp_path)
    exec(compile(tree, "<docs/plugins.md>", "exec"), {"__name__": "docs_block"})


_FEATURE_BLOCKS = _python_blocks(_section((DOCS / "plugins.md").read_text(),
                                          "## Optional features: LoRA and batching"))


@pytest.mark.parametrize("block", _FEATURE_BLOCKS,
                         ids=[f"block{i}" for i in range(len(_FEATURE_BLOCKS))])
def test_optional_feature_docs_code_blocks_run(block, tmp_path, monkeypatch):
    assert block.startswith("import"), "the example runs: it imports what it uses"
    test_trainer_docs_code_blocks_run(block, tmp_path, monkeypatch)


# -- the docs as a site: what `nox -s docs` (mkdocs build --strict) does not see --------------

_LINK = re.compile(r"\]\((?P<target>(?:docs|packages|contract-tests)/[^)#\s]*)(?:#(?P<anchor>[^)\s]+))?\)")


def _anchors(page: Path) -> set[str]:
    """The anchors of a page's headings, as GitHub and MkDocs' toc both write them for the
    headings these docs use (lower case, punctuation dropped, spaces as hyphens)."""
    found, fence = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            title = line.lstrip("#").strip().replace("`", "").lower()
            found.add(re.sub(r"[\s-]+", "-", re.sub(r"[^\w\s-]", "", title)).strip("-"))
    return found


def test_the_readmes_links_reach_pages_and_headings():
    """README.md is outside the site: its links into the repository are checked here."""
    root = DOCS.parent
    links = list(_LINK.finditer((root / "README.md").read_text(encoding="utf-8")))
    assert len(links) >= 8
    for link in links:
        target = root / link["target"]
        assert target.exists(), f"README.md links to {link['target']}, which does not exist"
        if link["anchor"]:
            assert link["anchor"] in _anchors(target), \
                f"README.md links to {link['target']}#{link['anchor']}: no such heading"


def test_long_pages_open_with_a_table_of_contents():
    for page in sorted(DOCS.rglob("*.md")):
        lines = page.read_text(encoding="utf-8").splitlines()
        if len(lines) > 400:
            assert any(line.startswith("Contents: ") for line in lines[:5]), \
                f"docs/{page.relative_to(DOCS)} has {len(lines)} lines and no contents line"
