#!/usr/bin/env bash
# Sets up everything on a fresh Debian machine, with no manual step: Debian packages (when root),
# a virtual environment in .venv, torch (the CPU build), rlbench and every in-repo plugin.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${RLBENCH_VENV:-.venv}

# Debian packages the core and the plugins build or run against. Missing ones are installed when
# we are root; otherwise the plugin that needs them reports itself unavailable, with the reason.
DEBIAN_PACKAGES=(gcc pkg-config binutils iproute2 dpdk libdpdk-dev pocl-opencl-icd ocl-icd-libopencl1
                 chromium libjs-jquery libjs-jquery-flot libjs-jquery-stupidtable libjs-bootstrap node-blueimp-md5)
missing=()
for pkg in "${DEBIAN_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing Debian packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "setup: not root, skipping Debian packages: ${missing[*]} (plugins needing them will say so)"
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
# torch first, pinned: the CPU build; any looser spec may pull several GB of CUDA wheels.
"$VENV/bin/python" -c "import torch" 2>/dev/null || "${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" "ray==2.60.0"  # --launcher ray and the ray transport; pinned (rlbench.builtin.capabilities.RAY_REQUIREMENT), Ray's PyPI wheel is CPU-only
"${PIP[@]}" -e ".[test,envs]"  # envs: Atari, MinAtar and MuJoCo (pyproject.toml)
for plugin in plugins/*/ examples/*/; do
  if [ -f "$plugin/pyproject.toml" ]; then "${PIP[@]}" -e "$plugin"; fi
done
"${PIP[@]}" -e "plugins/upmem[bench]"  # numba: the peer `rlbench upmem bench` prints beside the emulator
# Optional: Intel's FPGA emulator (an OpenCL ACCELERATOR with channels) for the fpga plugin.
if [ "${RLBENCH_FPGA_EMULATOR:-0}" = 1 ]; then "${PIP[@]}" -e "plugins/fpga[emulator]"; fi
"$VENV/bin/rlbench" list >/dev/null
echo "setup: ready ($VENV/bin/rlbench)"
