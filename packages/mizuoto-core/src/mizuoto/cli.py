"""The ``mizuoto`` command.

Exit codes: 0 success; 1 unexpected error; 2 bad request, option or usage (also ``serve`` on a
port already in use); 3 engine, model or file not found (or a checkpoint that does not match);
4 capability not supported; 5 a batch finished with failed lines (its manifest names them); 130
interrupted (SIGINT; also a training run stopped by Ctrl-C, its checkpoint saved); 143 a
training run stopped by SIGTERM.

The group only: each command is a module of :mod:`mizuoto.commands` (``say``, ``edit``,
``batch``, ...) whose ``COMMANDS`` the group adds, so that a new command is one new file there.
What the commands share, options and reporting, is :mod:`mizuoto.commands.toolkit`.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil

import click

import mizuoto.commands
from mizuoto.errors import MizuotoError

log = logging.getLogger("mizuoto")


class _Group(click.Group):
    """Turns Mizuoto errors into one-line messages and exit codes (tracebacks with --debug),
    and adds the commands plugins register (``register_commands``) when commands are looked up.
    """

    _plugin_commands_added = False

    def _add_plugin_commands(self) -> None:
        if self._plugin_commands_added:
            return
        self._plugin_commands_added = True
        from mizuoto.plugins import load_plugins, pm

        load_plugins()
        builtin = dict(self.commands)
        pm.hook.register_commands(cli=self)
        for name, command in builtin.items():  # a plugin may add commands, not replace ours
            if self.commands[name] is not command:
                log.warning("a plugin's command %r is ignored: mizuoto has its own", name)
                self.commands[name] = command

    def list_commands(self, ctx):
        self._add_plugin_commands()
        return super().list_commands(ctx)

    def get_command(self, ctx, name):
        command = super().get_command(ctx, name)
        if command is None:
            self._add_plugin_commands()
            command = super().get_command(ctx, name)
        return command

    def invoke(self, ctx):
        if not (ctx.obj and ctx.obj.get("debug")):
            _name_thread_disk_failures()
        try:
            return super().invoke(ctx)
        except MizuotoError as exc:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(f"Error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("Interrupted.", err=True)
            ctx.exit(130)
        except OSError as exc:
            # what only the write itself can tell (a full disk, a device that refuses):
            # one line naming the file, not a traceback
            if ctx.obj and ctx.obj.get("debug"):
                raise
            where = f": {exc.filename}" if exc.filename else ""
            click.echo(f"Error: {exc.strerror or exc}{where}", err=True)
            ctx.exit(1)


def _name_thread_disk_failures() -> None:
    """A full or failing disk met by a writer thread (TensorBoard's event writer, a trainer's
    checkpoint saver) is one named line on stderr, as on the main thread: no traceback."""
    import threading

    from mizuoto.runtime.atomic import storage_error

    previous = threading.excepthook
    if getattr(previous, "names_disk_failures", False):
        return

    def hook(args):
        where = getattr(args.exc_value, "filename", None) or f"(thread {args.thread.name})"
        named = storage_error(args.exc_value, where) if args.exc_value else None
        if named is None:
            return previous(args)
        click.echo(f"Error: {named}", err=True)

    hook.names_disk_failures = True
    threading.excepthook = hook


@click.group(cls=_Group)
@click.version_option(package_name="mizuoto-core")
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars or info messages.")
@click.pass_context
def cli(ctx, debug, quiet):
    """Mizuoto: neural text-to-speech with pluggable engines."""
    ctx.ensure_object(dict)
    ctx.obj.update(debug=debug, quiet=quiet)
    level = logging.DEBUG if debug else (logging.WARNING if quiet else logging.INFO)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")


def builtin_commands() -> dict[str, click.Command]:
    """Mizuoto's own commands by name: the ``COMMANDS`` of every module in
    :mod:`mizuoto.commands` (a module without it, such as the toolkit, adds none)."""
    found: dict[str, click.Command] = {}
    for module in sorted(pkgutil.iter_modules(mizuoto.commands.__path__), key=lambda m: m.name):
        imported = importlib.import_module(f"{mizuoto.commands.__name__}.{module.name}")
        for command in getattr(imported, "COMMANDS", ()):
            if command.name in found:
                raise RuntimeError(f"two commands named {command.name!r} in mizuoto.commands")
            found[command.name] = command
    return found


for _command in builtin_commands().values():
    cli.add_command(_command)


def main() -> None:
    cli(obj={"may_restart": True})


if __name__ == "__main__":
    main()
