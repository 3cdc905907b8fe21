"""The API reference (docs/api/, written by scripts/api_reference.py) as a build with warnings as errors:
every public name of rlbench.kit.* and rlbench.testing.* has a docstring, the committed pages are
what the script writes now, and the modules stay cheap to import."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from support import REPO

SCRIPT = REPO / "scripts" / "api_reference.py"


def load_script():
    spec = importlib.util.spec_from_file_location("api_reference", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_public_name_of_the_kits_has_a_docstring():
    missing = load_script().undocumented()
    assert missing == [], f"public names without a docstring (say briefly what each is for): {', '.join(missing)}"


def test_the_committed_api_reference_is_what_the_script_writes():
    stale = load_script().differences()
    assert stale == [], f"docs/api/ is out of date ({', '.join(stale)}): run python scripts/api_reference.py"


def test_the_documented_modules_import_nothing_heavy():
    script = load_script()
    code = (f"import sys; modules = {script.MODULES!r}; heavy = {script.HEAVY!r}\n"
            "for name in modules: __import__(name)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"importing the kit imported {out.stdout.strip()}"


def test_a_module_without_all_shows_what_it_defines_and_not_what_it_imports():
    script = load_script()
    import rlbench.kit.replay as replay

    names = script.public_names(replay)
    assert "ReplayError" in names and "validated_update" in names
    assert "RlbenchError" not in names and "np" not in names and "annotations" not in names
