"""Which plugin API version each check belongs to, and what a failing check does to a plugin
written for an older one.

Every check belongs to the API version that introduced its requirement: a test marked
``@pytest.mark.since_api("1.1")`` (a module's ``pytestmark``), an assertion raised with
:func:`require` and its own ``since``, else ``1.0``. A check of the plugin's declared
``plugin_api`` or older fails as usual; a newer one that fails is reported as a
:class:`~mizuoto.plugin.PluginAPIDeprecation` naming the cause and the fix (the failure's first
line), the test passes, and the run ends with one line per such plugin counting what it misses
(:func:`closing_lines`). Nothing is deselected or skipped for its version: every check runs on
every plugin.
"""

from __future__ import annotations

import attrs

#: the version of a check that names none: the first documented plugin API
FIRST_VERSION = "1.0"


def parse(version: str) -> tuple[int, ...]:
    """``"1.10"`` → ``(1, 10)``: versions compare by number, not as text."""
    return tuple(int(part) for part in str(version).split("."))


def newer(check: str, plugin: str) -> bool:
    """Whether a check of API ``check`` is newer than a plugin written for API ``plugin``."""
    return parse(check) > parse(plugin)


def later(*versions: str | None) -> str:
    """The latest of ``versions`` (``None`` ignored), at least :data:`FIRST_VERSION`."""
    return max((v for v in versions if v), key=parse, default=FIRST_VERSION)


class Unmet(AssertionError):
    """A requirement of API ``since`` the plugin does not meet (see :func:`require`)."""

    def __init__(self, message: str, since: str) -> None:
        super().__init__(message)
        self.since_api = since


def require(holds: bool, message: str, since: str = "1.1") -> None:
    """Fail with ``message`` (its first line: what was seen, the likely cause and the fix)
    unless ``holds``. ``since``: the API version the requirement belongs to, when it is newer
    than the test's own (an audio check of 1.1 inside a test of 1.0)."""
    if not holds:
        raise Unmet(message, since)


def plugin_of(cls: type) -> str:
    """``"package (engine NAME)"``: how the closing line names a plugin."""
    name = getattr(cls, "name", None) or getattr(cls, "engine", None) or cls.__name__
    return f"{cls.__module__.split('.')[0]} ({'engine' if hasattr(cls, 'name') else 'trainer'} "\
           f"{name})"


@attrs.define
class Missed:
    """Per plugin and the API it is written for: the checks of newer APIs it fails, by the
    version they belong to."""

    tests: dict[tuple[str, str], dict[str, set[str]]] = attrs.field(factory=dict)

    def note(self, plugin: str, written: str, since: str, test: str) -> None:
        self.tests.setdefault((plugin, written), {}).setdefault(since, set()).add(test)

    def clear(self) -> None:
        self.tests.clear()

    def closing_lines(self) -> list[str]:
        """``plugin X (engine Y) is written for API 1.0; it misses 3 requirements of 1.1: a,
        b, c (...)``: one line per plugin, the versions in order."""
        lines = []
        for (plugin, written), by_version in sorted(self.tests.items()):
            parts = [f"{len(tests)} requirements of {version}: {', '.join(sorted(tests))}"
                     for version, tests in sorted(by_version.items(),
                                                  key=lambda item: parse(item[0]))]
            lines.append(f"plugin {plugin} is written for API {written}; it misses "
                         f"{'; '.join(parts)} (see the PluginAPIDeprecation warnings; "
                         f"enforced from API {parse(written)[0] + 1}.0)")
        return lines
