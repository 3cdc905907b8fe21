#!/usr/bin/env bash
# The gpu plugin's checks on a lent GPU machine, in one call (plugins/gpu/README.md, "On a lent GPU").
# That machine has torch and CUDA but reaches no registry: gymnasium (and for `atari`, ale-py with its
# ROMs and opencv) travel as wheels in .whl/, fetched on a machine that reaches PyPI by the `wheels`
# step, and the project is installed from the working tree without dependencies. Steps, each under
# its own time limit, logs under $OUT (at most 8 files come back):
#   wheels   (run HERE, not on the lent machine; PYTHON=.venv/bin/python names the project's interpreter)
#            pip download into .whl/ (about 70 MB): gymnasium, opencv-python-headless, and ale-py for
#            CPython 3.10-3.13 (the lent image's Python picks its own), each in the version installed here
#   setup    the install, the card (nvidia-smi), `rlbench gpu info`
#   bench    `rlbench gpu bench --profile`: the target figures and where a launch's time goes
#   e2e      `rlbench gpu bench --full` of the end-to-end figures: learning, greedy returns
#   tests    `pytest plugins/gpu/tests`: every CUDA test
#   cuda-tests  `pytest plugins/gpu/tests/test_cuda.py` alone, skips listed
#   env      `rlbench bench env`: random actions, eager and graph, beside gymnasium
#   compile  `rlbench gpu bench --capture compile --profile` of the captured figures
#   e2e-compile  the end-to-end figures with --capture compile
#   atari    issue #39's EMC2'20 setting: `rlbench gpu bench --figure cnn_update` (the Nature-CNN update on
#            the card, captured and eager, beside the CPU's), then `rlbench gpu atari`: Atari DQN with the
#            learner on CUDA and actors on CPU cores, 1 and 4 actors, beside the same runs all on the CPU
#   cores    issue #41 item 10, what 2 cores cannot show, on the lent machine's CPU cores (no GPU used):
#            `bench actors` 1 -> 8, `bench policies` with 2 and 4 data-parallel learners, `bench scale`
#            with 1, 2 and 4 shards; each prints its machine line (cores, load) beside the figures
# Usage: bash plugins/gpu/on-a-lent-gpu.sh [STEP ...]   (default: setup bench e2e tests)
set -u
OUT=${OUT:-/tmp/rlbench-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
STEPS=${*:-setup bench e2e tests}

# Each step: its log under $OUT, its exit status and seconds on one line of the output.
step() {
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    echo "== $name: exit $? in $((SECONDS - start)) s (limit $limit s)"
}

# On a machine that reaches PyPI: the wheels the lent machine cannot fetch, in the versions installed
# here (binary ones for each CPython the lent image may have; pip there takes the one that fits).
wheels() (
    set -e
    mkdir -p .whl
    local python=${PYTHON:-python3}
    version() { "$python" -c "import importlib.metadata as m; print(m.version('$1'))"; }
    "$python" -m pip download -q --no-deps --dest .whl "gymnasium==$(version gymnasium)"
    "$python" -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 --python-version 3.11 \
        --dest .whl "opencv-python-headless==$(version opencv-python-headless)"
    for cpython in 3.10 3.11 3.12 3.13; do  # ale-py 0.12's wheels are manylinux_2_28 (glibc 2.28 or newer)
        "$python" -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
            --platform manylinux_2_28_x86_64 --python-version "$cpython" --dest .whl "ale-py==$(version ale-py)"
    done
    ls -l .whl
)

# A subshell with -e: the step's status is that of the first command that fails.
install() (
    set -e
    if ls .whl/*.whl >/dev/null 2>&1; then
        # each package once, in the wheel that fits this Python (ale-py comes for several)
        packages=$(ls .whl/*.whl | xargs -n1 basename | sed -E 's/-[0-9].*//' | sort -u)
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            --find-links .whl $packages
    fi
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.draw,temperature.gpu \
        --format=csv
    python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))"
    # builds the core's C extensions: gcc and the Python headers are on that image (seen 2026-11-26)
    python3 -m pip install -q --no-deps --no-index --no-build-isolation -e . -e plugins/gpu
    python3 -m rlbench gpu info
)

export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
for name in $STEPS; do
    case $name in
        wheels) wheels; echo "== wheels: exit $?" ;;
        setup) install >"$OUT/setup.log" 2>&1; echo "== setup: exit $?" ;;
        bench) step bench 120 python3 -m rlbench gpu bench --profile --figure dqn_updates --figure replay_cycles \
                   --figure env_steps ;;
        e2e) step e2e 150 python3 -m rlbench gpu bench --full --figure dqn_e2e --figure ddpg_e2e ;;
        tests) step tests 150 python3 -m pytest -q -p no:cacheprovider plugins/gpu/tests ;;
        cuda-tests) step cuda-tests 90 python3 -m pytest -q -rs -p no:cacheprovider plugins/gpu/tests/test_cuda.py ;;
        env) step env 90 python3 -m rlbench bench env ;;
        e2e-compile) step e2e-compile 240 python3 -m rlbench gpu bench --full --capture compile --figure dqn_e2e \
                         --figure ddpg_e2e ;;
        compile) step compile 240 python3 -m rlbench gpu bench --capture compile --profile --figure dqn_updates \
                     --figure replay_cycles --figure env_steps ;;
        atari) step atari 420 sh -c 'python3 -m rlbench gpu bench --figure cnn_update --seconds 2 --profile;
                                      python3 -m rlbench gpu atari --steps 5000 --actors 1,4' ;;
        cores) step cores 480 sh -c 'python3 -m rlbench bench actors --max-actors 8 --steps-per-actor 20000;
                                     python3 -m rlbench bench policies --learners 2 --learners 4;
                                     python3 -m rlbench bench scale --shards 1 --shards 2 --shards 4 --clients 16 \
                                         --clients 64 --clients 256 --seconds 2' ;;
        *) echo "unknown step $name (wheels setup bench e2e tests cuda-tests env compile e2e-compile atari cores)"; exit 2 ;;
    esac
done
# The reply keeps the end of the output: the figures' lines and the tests' summary last.
grep -h -E "^(torch|NVIDIA|name)|gpu info|CUDA|^# device" "$OUT/setup.log" 2>/dev/null | head -8
for log in bench e2e compile e2e-compile env atari cores; do
    [ -f "$OUT/$log.log" ] && grep -v -E "^(STAGE|USDT|\[W)" "$OUT/$log.log" | grep -E "^[A-Za-z]|^  [A-Za-z]|      " \
        | cut -c1-400
done
for log in tests cuda-tests; do [ -f "$OUT/$log.log" ] && tail -25 "$OUT/$log.log"; done
true
