"""The shape of the code: no import cycles (counting imports inside functions, which run later but
still tie modules together), plugins and examples use only rlbench's public surface, and every
relative link in the documentation points at something."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from support import REPO

PUBLIC = ("rlbench", "rlbench.kit", "rlbench.protocols", "rlbench.testing", "rlbench.hookspecs", "rlbench.errors",
          "rlbench.datasets")
PLUGIN_PACKAGES = [path for path in sorted((REPO / "plugins").glob("*/rlbench_*")) if path.is_dir()]
EXAMPLES = sorted((REPO / "examples").glob("*/"))


def modules_of(root: Path, package: str) -> dict[str, Path]:
    """Module name -> file, for every module of `package` under `root`: Python files, and the built C
    extensions (leaves: they import nothing of the package)."""
    found = {}
    for path in (root / package).rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    for path in (root / package).rglob("*.so"):
        parts = list(path.relative_to(root).parts)
        parts[-1] = parts[-1].split(".")[0]
        found[".".join(parts)] = path
    return found


def imports_of(module: str, path: Path) -> list[tuple[str, int]]:
    """Every module name an import statement in the file names (anywhere: in functions too), with
    its line; `from package import submodule` names the submodule. TYPE_CHECKING blocks are skipped."""
    tree = ast.parse(path.read_text())
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for child in ast.walk(node))
    found = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]
    return found


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    modules = modules_of(root, package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        if path.suffix == ".so":
            continue
        for target, _ in imports_of(name, path):
            while target and target not in modules:  # a name imported from a module, or a foreign module
                target = target.rpartition(".")[0]
            if target and target != name:
                graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("def later():\n    from pkg.a import thing\n")
    (package / "c.py").write_text("from . import a\n")
    assert cycles(import_graph(tmp_path, "pkg")) == [["pkg.a", "pkg.b"]]


def test_the_core_has_no_import_cycle():
    assert cycles(import_graph(REPO, "rlbench")) == []


@pytest.mark.parametrize("package", PLUGIN_PACKAGES, ids=lambda p: p.name)
def test_no_plugin_has_an_import_cycle(package):
    assert cycles(import_graph(package.parent, package.name)) == []


def rlbench_imports(path: Path) -> list[tuple[str, int]]:
    return [(name, line) for name, line in imports_of(path.stem, path) if name == "rlbench" or name.startswith("rlbench.")]


def plugin_and_example_files() -> list[Path]:
    return sorted(p for folder in (REPO / "plugins", REPO / "examples") for p in folder.rglob("*.py")
                  if ".egg-info" not in str(p) and "/build/" not in str(p))


def test_plugins_and_examples_never_import_the_builtin_plugin_or_a_private_module():
    offending = []
    for path in plugin_and_example_files():
        for name, line in rlbench_imports(path):
            parts = name.split(".")
            if (len(parts) > 1 and parts[1] == "builtin") or any(part.startswith("_") for part in parts):
                offending.append(f"{path.relative_to(REPO)}:{line}: {name}")
    assert offending == []


def test_plugin_packages_and_examples_use_only_the_public_surface():
    # Their own tests may drive the core's internals on purpose (one gpu fixture runs the core's loop on
    # the CPU device); the packages users install may not.
    offending = []
    for path in plugin_and_example_files():
        if "tests" in path.relative_to(REPO).parts:
            continue
        for name, line in rlbench_imports(path):
            # `from rlbench import X` names rlbench.X; X may be a function of the top-level package
            public = any(name == module or name.startswith(module + ".") for module in PUBLIC[1:]) \
                or (name.count(".") == 1 and name.split(".")[1] in ("RunConfig", "run", "get_registry", "__version__"))
            if not public and name != "rlbench":
                offending.append(f"{path.relative_to(REPO)}:{line}: {name}")
    assert offending == []


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted(REPO.glob("plugins/*/README.md")),
            *sorted(REPO.glob("examples/*/README.md"))]


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_relative_links_in_the_documentation_point_at_something():
    broken = []
    for document in documents():
        if not document.exists():
            continue
        for target in LINK.findall(document.read_text()):
            if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                continue
            resolved = (document.parent / target).resolve()
            if not resolved.exists() or REPO.resolve() not in [resolved, *resolved.parents]:
                broken.append(f"{document.relative_to(REPO)} -> {target}")
    cited = re.findall(r"docs/[\w./-]+", (REPO / "asv.conf.json").read_text())
    broken += [f"asv.conf.json -> {path}" for path in cited if not (REPO / path).exists()]
    assert broken == []
