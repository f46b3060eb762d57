"""Worker: the command run under `rbroker run`; writes what it was given as JSON to OUT_FILE:
its arguments after OUT_FILE and the variables that keep frameworks inside the grant.

Usage: report_framework_env.py OUT_FILE [ARGS...]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

NAMES = (
    "CUDA_VISIBLE_DEVICES",
    "RBROKER_LEASE_ID",
    "RBROKER_GRANTED_MIB",
    "RBROKER_GPU_TOTAL_MIB",
    "RBROKER_MEMORY_FRACTION",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "TF_FORCE_GPU_ALLOW_GROWTH",
)

if __name__ == "__main__":
    report = {"argv": sys.argv[2:], "env": {n: os.environ.get(n) for n in NAMES}}
    Path(sys.argv[1]).write_text(json.dumps(report))
