#!/usr/bin/env bash
# The real-GPU check of issue 3: run only the tests marked `gpu` and print their results.
#
#   bench/gpu_check.sh [extra pytest arguments]
#
# On a machine with an NVIDIA driver it runs the NVML gateway contract on real NVML
# (tests/desktop/gpu/test_nvml_gateway.py::TestRealNvml), a broker on real NVML, and, where
# PyTorch with CUDA is installed, memory allocated inside a lease attributed to that lease
# and `lease.limit_torch()` stopping an allocation past the grant with an out-of-memory error
# while the lease stays intact (where JAX is installed, the same with
# XLA_PYTHON_CLIENT_MEM_FRACTION from the lease) (tests/desktop/gpu/test_real_gpu.py). Without a
# driver every test is skipped, with the reason.
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

echo "== machine"
uname -srm
if command -v nvidia-smi >/dev/null 2>&1; then
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
"${PY[@]}" -m pytest -m gpu -v -s -rs -p no:cacheprovider tests/desktop "$@"
rc=$?
echo "== pytest exit code: $rc"
exit $rc
