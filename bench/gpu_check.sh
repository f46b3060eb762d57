#!/usr/bin/env bash
# The real-GPU check of issue 3: run only the tests marked `gpu` and print their results.
#
#   bench/gpu_check.sh [--fake-driver] [extra pytest arguments]
#
# On a machine with an NVIDIA driver it runs the NVML gateway contract on real NVML
# (tests/desktop/gpu/test_nvml_gateway.py::TestRealNvml), a broker on real NVML, and, where
# PyTorch with CUDA is installed, memory allocated inside a lease attributed to that lease
# and `lease.limit_torch()` stopping an allocation past the grant with an out-of-memory error
# while the lease stays intact (where JAX is installed, the same with
# XLA_PYTHON_CLIENT_MEM_FRACTION from the lease) (tests/desktop/gpu/test_real_gpu.py). Without a
# driver every test is skipped, with the reason.
#
# --fake-driver (Linux, needs cc): the same tests on the fake NVIDIA driver instead of a real
# one (tests/fakes/nvml_driver, docs/development.md "The fake driver"): the library is built,
# its state written (two whole GPUs and an A100 in MIG mode) and the tests run with
# LD_LIBRARY_PATH and RBROKER_FAKE_NVML_STATE set, so that the real pynvml loads it as the
# driver and every test but the PyTorch and JAX ones runs (they need CUDA). As root the tests
# run in a network namespace of their own: a broker on real NVML takes the computer's lock
# (an abstract Unix socket), which is then theirs and not a real broker's of this computer.
# tests/desktop/gpu/test_fake_driver_broker.py runs this on every CI.
# Python: $PYTHON, else .venv/bin/python, else `uv run python`.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ -n "${PYTHON:-}" ]; then
  PY=("$PYTHON")
elif [ -x .venv/bin/python ]; then
  PY=(.venv/bin/python)
else
  PY=(uv run python)
fi

fake_driver=""
if [ "${1:-}" = "--fake-driver" ]; then
  fake_driver=1
  shift
fi
own_network=()

echo "== machine"
uname -srm
if [ -n "$fake_driver" ]; then
  state_dir="$(mktemp -d "${TMPDIR:-/tmp}/rbroker-fake-driver.XXXXXX")"
  trap 'rm -rf "$state_dir"' EXIT
  folder="$("${PY[@]}" -m tests.fakes.nvml_driver "$state_dir/driver.state")" || exit 2
  export LD_LIBRARY_PATH="$folder${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export RBROKER_FAKE_NVML_STATE="$state_dir/driver.state"
  echo "fake NVIDIA driver: $folder/libnvidia-ml.so.1, state $RBROKER_FAKE_NVML_STATE:"
  sed -n -E 's/^(driver_version|gpu|slice|mig) /  \1 /p' "$RBROKER_FAKE_NVML_STATE"
  if [ "$(id -u)" = 0 ] && unshare --net true 2>/dev/null; then
    own_network=(unshare --net)
  fi
elif command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,uuid,name,driver_version,memory.total,memory.used,mig.mode.current \
    --format=csv || true
else
  echo "nvidia-smi not found: the gpu tests will skip unless NVML still answers"
fi
"${PY[@]}" - <<'PY'
try:
    import torch
except ImportError:
    print("PyTorch: not installed (the allocation check skips)")
else:
    print(f"PyTorch {torch.__version__}, CUDA available: {torch.cuda.is_available()}")
try:
    import jax
except ImportError:
    print("JAX: not installed (the JAX cap check skips)")
else:
    print(f"JAX {jax.__version__}, devices: {jax.devices()}")
PY

echo "== tests marked gpu"
${own_network[@]+"${own_network[@]}"} "${PY[@]}" -m pytest -m gpu -v -s -rs -p no:cacheprovider tests/desktop "$@"
rc=$?
echo "== pytest exit code: $rc"
exit $rc
