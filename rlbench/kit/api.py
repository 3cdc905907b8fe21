"""The plugin API's version, and the rule for which plugins it serves (docs/plugin-api-changelog.md).

The version is MAJOR.MINOR. A minor release only adds to the contract (a hook, a callback keyword, a
kit function, a rule a plugin opts into); a major one may break it. A plugin says which version it
targets with a module (or plugin object) attribute::

    RLBENCH_API = "1.1"

and is served by an rlbench of the same major whose minor is the same or newer; any other is refused
with the reason. A plugin that declares nothing targets "1.0", the contract before it was versioned.

A rule added in a minor release is a deprecation for plugins that target an older minor: what broke
it is accepted with a PluginAPIDeprecationWarning that names the release where it becomes an error
(REMOVED_IN); a plugin that targets the rule's version or later has opted in and is held to it.
"""

from __future__ import annotations

import re
import warnings

API_VERSION = "1.1"
REMOVED_IN = "2.0"  # where what is deprecated in 1.x becomes an error
UNVERSIONED = "1.0"  # what a plugin that declares no RLBENCH_API targets
DECLARATION = "RLBENCH_API"  # the attribute a plugin module (or object) declares it with
CHANGELOG = "docs/plugin-api-changelog.md"

_VERSION = re.compile(r"(\d+)\.(\d+)")


class PluginAPIDeprecationWarning(DeprecationWarning):
    """A plugin relies on behaviour the plugin API still accepts but will refuse in REMOVED_IN."""


def parse(version: str) -> tuple[int, int]:
    """'1.1' -> (1, 1); ValueError unless it is MAJOR.MINOR."""
    match = _VERSION.fullmatch(version) if isinstance(version, str) else None
    if match is None:
        raise ValueError(f"{DECLARATION} must be a 'MAJOR.MINOR' string such as {API_VERSION!r}, got {version!r}")
    return int(match[1]), int(match[2])


def incompatibility(target: str, provided: str = API_VERSION) -> str | None:
    """Why an rlbench of plugin API `provided` cannot serve a plugin that targets `target`, or None."""
    try:
        (major, minor), (have_major, have_minor) = parse(target), parse(provided)
    except ValueError as exc:
        return str(exc)
    if major != have_major:
        side = "a newer" if major > have_major else "an older"
        return (f"it targets plugin API {target}, {side} major version than this rlbench's {provided} (a major "
                f"version breaks the contract; see {CHANGELOG}): install an rlbench of API {major}.x or a "
                f"release of the plugin for {have_major}.x")
    if minor > have_minor:
        return (f"it targets plugin API {target}, newer than this rlbench's {provided}: upgrade rlbench "
                f"(pip install -U rlbench)")
    return None


def holds_to(target: str | None, since: str) -> bool:
    """Whether a plugin that targets `target` is held to a rule added in plugin API `since`."""
    return parse(target or UNVERSIONED) >= parse(since)


def deprecation(rule: str, *, target: str | None, since: str) -> tuple[str, bool]:
    """(message, refused) for a plugin that breaks `rule`, added in plugin API `since`: refused when it
    targets `since` or later, else deprecated, to be refused from REMOVED_IN."""
    if holds_to(target, since):
        return f"{rule} (a rule since plugin API {since}, which it targets)", True
    return (f"{rule}: deprecated since plugin API {since}, an error from {REMOVED_IN} (it targets "
            f"{target or UNVERSIONED}; see {CHANGELOG})"), False


def warn(message: str, *, stacklevel: int = 2) -> None:
    """Issue a PluginAPIDeprecationWarning with `message`, attributed `stacklevel` frames above the caller."""
    warnings.warn(PluginAPIDeprecationWarning(message), stacklevel=stacklevel + 1)
