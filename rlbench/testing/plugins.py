"""registered: a plugin in this process's registry without installing a distribution, for tests.

Like gymnasium's `register()` or pytest's `-p NAME`: the plugin (a module or an object with
`@hookimpl` functions) is loaded as an entry point would be, by the same rules (names, RLBENCH_API,
a hook that raises), beside the built-ins and the installed plugins. Inside the `with` block
`rlbench.get_registry()`, the kits' registered names (`check_transport("uds")`) and `rlbench.run`
see it; afterwards the registry is what it was. Only this process sees it: the roles of a
distributed run are processes that build their own registry from the installed entry points, so an
end-to-end distributed test needs the distribution installed (`pip install -e .`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator


@contextlib.contextmanager
def registered(*, installed: bool = True, **plugins: Any) -> Iterator[Any]:
    """Make `plugins` (name=module or object, the name being the entry point's) part of this process's
    registry for the `with` block, and yield that registry; one stands in for an installed plugin of
    the same name (your own, after `pip install -e .`). `installed=False` leaves the installed
    third-party plugins out (the built-ins stay). A plugin given here that is refused raises
    AssertionError with why (the reason `rlbench list` would print)."""
    from rlbench import plugins as manager
    from rlbench.registry import normalised

    registry, pluggy_manager = manager.build(list(plugins.items()), load_entry_points=installed)
    given = {normalised(name) for name in plugins}
    refused = [f"plugin {b.name!r} was refused: {b.error}" for b in registry.broken if normalised(b.name) in given]
    if refused:
        raise AssertionError("; ".join(refused))
    saved = manager._registry, manager._manager
    manager._registry, manager._manager = registry, pluggy_manager
    try:
        yield registry
    finally:
        manager._registry, manager._manager = saved
