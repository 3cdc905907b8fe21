#!/usr/bin/env bash
# The native extensions (rlbench/_native/*.c) built -O0 -g with AddressSanitizer and
# UndefinedBehaviorSanitizer, and the tests that drive them (the wire codec and the replay node's
# fast path, the sum tree, the tabular engine) run against that build: a bad reference count, an
# out-of-bounds access or undefined behaviour fails here instead of corrupting a run. The build goes
# into a temporary copy of the package; the in-place optimised builds the rest of the suite uses are
# not touched. Where the compiler has no sanitizers it still builds -O0 -g, runs the tests, and says
# that the sanitizers were skipped and why. scripts/test.sh (and so CI) runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
CC=${CC:-gcc}
TESTS=(tests/test_fast_path.py tests/test_native_refcounts.py tests/test_replay.py tests/test_tabular.py)
started=$(date +%s)

work=$(mktemp -d "${TMPDIR:-/tmp}/rlbench-sanitized.XXXXXX")
trap 'rm -rf "$work"' EXIT
site="$work/site"
reports="$work/reports"
mkdir -p "$site" "$reports"
# The package's Python sources, without the optimised extensions (or stale bytecode) beside them.
cp -r rlbench "$site/rlbench"
find "$site/rlbench" \( -name '*.so' -o -name __pycache__ \) -prune -exec rm -rf {} +

read -r python_include numpy_include suffix < <("$PY" -c '
import sysconfig, numpy
print(sysconfig.get_paths()["include"], numpy.get_include(), sysconfig.get_config_var("EXT_SUFFIX"))')

# Sanitizers: the compiler must build with them and a Python that was not built with ASan must load
# them (LD_PRELOAD: ASan's runtime has to come before every other library).
sanitize=(-fsanitize=address,undefined -fno-sanitize-recover=undefined)
preload=""
skipped=""
asan=$("$CC" -print-file-name=libasan.so)
ubsan=$("$CC" -print-file-name=libubsan.so)
if [ "$asan" = libasan.so ] || [ "$ubsan" = libubsan.so ]; then
  skipped="$CC has no libasan/libubsan runtime (Debian: libasan8, libubsan1)"
elif ! echo 'int twice(int x) { return 2 * x; }' | "$CC" -x c - -shared -fPIC "${sanitize[@]}" -o "$work/probe.so" \
       2>"$work/probe.log"; then
  skipped="$CC cannot build with ${sanitize[*]}: $(head -c 300 "$work/probe.log")"
else
  preload="$(readlink -f "$asan") $(readlink -f "$ubsan")"
  if ! LD_PRELOAD="$preload" ASAN_OPTIONS=detect_leaks=0 "$PY" -c \
       "import ctypes, sys; sys.exit(ctypes.CDLL(sys.argv[1]).twice(21) != 42)" "$work/probe.so" \
       2>"$work/probe.log"; then
    skipped="Python cannot load an ASan-built extension with LD_PRELOAD=$preload: $(head -c 300 "$work/probe.log")"
    preload=""
  fi
fi
if [ -n "$skipped" ]; then
  echo "sanitized-native-tests: SANITIZERS SKIPPED: $skipped; the extensions are built -O0 -g without them"
  sanitize=()
fi

flags=(-O0 -g -fno-omit-frame-pointer -std=c11 -Wall -Wno-unused-function -fPIC -shared
       -I"$python_include" -I"$numpy_include" -Irlbench/_native "${sanitize[@]}")
modules=()
for source in rlbench/_native/*.c; do  # rlbench/_native/x.c is rlbench._x (setup.py's extensions)
  name=$(basename "$source" .c)
  "$CC" "${flags[@]}" "$source" -o "$site/rlbench/_$name$suffix"
  modules+=("rlbench._$name")
done
echo "sanitized-native-tests: built ${modules[*]} with -O0 -g ${sanitize[*]:-(no sanitizers)} into $site"

export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONSAFEPATH=1  # else a `python -m` role process puts the checkout (optimised builds) first on sys.path
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
if [ -z "$skipped" ]; then
  export LD_PRELOAD="$preload${LD_PRELOAD:+ $LD_PRELOAD}"
  export PYTHONMALLOC=malloc  # every Python object from malloc, whose bounds ASan checks
  # detect_leaks=0: CPython frees little at exit by design. ASan's reports go to files, so one from a
  # role process whose output a test captures is still seen; UBSan's go to stderr with gcc 12 (it
  # ignores log_path next to ASan), which the tests leave uncaptured and which is searched below.
  export ASAN_OPTIONS="detect_leaks=0:log_path=$reports/asan"
  export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$reports/ubsan"
fi

# The process that runs the tests first proves it holds this build: were one missing here, the
# editable install's finder would quietly load the checkout's optimised one. (A file, not stdin:
# multiprocessing's spawn re-imports the main module in each role process it starts.)
cat >"$work/run_tests.py" <<'EOF'
import importlib
import os
import sys

if __name__ == "__main__":
    site, rest = sys.argv[1], sys.argv[2:]
    split = rest.index("--")
    for name in rest[:split]:
        module = importlib.import_module(name)
        assert module.__file__.startswith(site + os.sep), f"{name} was loaded from {module.__file__}, not {site}"
    from rlbench.runtime.distributed import messages

    assert messages.NATIVE is not None, messages.NATIVE_REASON
    import pytest

    sys.exit(pytest.main(rest[split + 1:]))
EOF
# --capture=sys: what the tests print is captured as usual, but file descriptor 2 (where a sanitizer
# writes) stays the terminal's, so a report is shown and lands in the log.
set +e
"$PY" "$work/run_tests.py" "$site" "${modules[@]}" -- -q -p no:cacheprovider --capture=sys -m "not slow" \
  "${TESTS[@]}" 2>&1 | tee "$work/tests.log"
status=${PIPESTATUS[0]}
set -e
if compgen -G "$reports/*" >/dev/null; then
  echo "sanitized-native-tests: sanitizer reports:"
  for report in "$reports"/*; do
    echo "== $report"
    cat "$report"
  done
  status=1
fi
if grep -qE "runtime error:|ERROR: (Address|LeakSanitizer|UndefinedBehavior)|SUMMARY: [A-Za-z]*Sanitizer" \
     "$work/tests.log"; then
  echo "sanitized-native-tests: a sanitizer reported (above)"
  status=1
fi
elapsed=$(($(date +%s) - started))
if [ "$status" = 0 ]; then
  echo "sanitized-native-tests: passed in ${elapsed}s${skipped:+ (WITHOUT sanitizers: $skipped)}"
else
  echo "sanitized-native-tests: FAILED (status $status) in ${elapsed}s"
fi
exit "$status"
