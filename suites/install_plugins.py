"""asv's install step: the core's wheel, then every plugin folder of the commit being measured.

Run by asv.conf.json's install_command inside the environment asv built:
    python suites/install_plugins.py BUILD_DIR CORE_WHEEL
A plugin folder is any plugins/*/ or examples/*/ with a pyproject.toml, so commits from before a plugin
existed install what they had. Not a benchmark module: asv imports it and finds nothing to run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def plugin_folders(build_dir: Path) -> list[Path]:
    return sorted(p.parent for pattern in ("plugins/*/pyproject.toml", "examples/*/pyproject.toml")
                  for p in build_dir.glob(pattern))


# The same pin as scripts/setup.sh: the CPU build. A looser spec may pull several GB of CUDA wheels.
TORCH = "torch==2.13.0"


def main(build_dir: str, core_wheel: str) -> None:
    pip = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check"]
    subprocess.run([*pip, TORCH], check=True)
    folders = [str(p) for p in plugin_folders(Path(build_dir))]
    subprocess.run([*pip, core_wheel, *folders], check=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
