"""Worker: the command run under `rbroker run`; reports its environment and exits.

Usage: report_env.py OUT_FILE EXIT_CODE
Writes CUDA_VISIBLE_DEVICES (or `<unset>`) to OUT_FILE and exits with EXIT_CODE.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main() -> int:
    out, code = Path(sys.argv[1]), int(sys.argv[2])
    out.write_text(os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))
    return code


if __name__ == "__main__":
    sys.exit(main())
