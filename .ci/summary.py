"""The closing lines of `bash .ci/run`: the slowest tests of each set, the FLAKY list and the
passed and failed counts of every set added up.

    python3 .ci/summary.py LOGS_DIR

LOGS_DIR holds each set's pytest output (`linux.log`, `windows.log`, `cross.log`, any that
ran) and `flaky.jsonl` (tests/flaky.py: one JSON object a line, `set`, `nodeid`,
`first_failure`, its last lines as tests/flaky.py keeps them). The last line is
`total: N passed, N failed, N skipped`, every set added up.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

SETS = ("linux", "windows", "cross")
CLOSING = re.compile(r"^=+ (.*) in [0-9.]+s")
COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|rerun|left behind)\b")


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8", errors="replace").replace("\r", "").splitlines()


def slowest(lines: list[str]) -> list[str]:
    """The lines of pytest's `--durations` section (`slowest N durations`)."""
    out: list[str] = []
    inside = False
    for line in lines:
        if "slowest" in line and "durations" in line and line.startswith("="):
            inside = True
            continue
        if inside:
            if line.startswith("=") or not line.strip():
                break
            out.append(line)
    return out


def counts(lines: list[str]) -> dict[str, int]:
    """pytest's closing line's counts (the last closing line of the log), by word."""
    found: dict[str, int] = {}
    for line in lines:
        m = CLOSING.match(line)
        if m and COUNT.search(m.group(1)):
            found = {}
            for n, word in COUNT.findall(m.group(1)):
                key = "error" if word.startswith("error") else word
                found[key] = found.get(key, 0) + int(n)
    return found


def main(logs: Path) -> None:
    total: dict[str, int] = {}
    for name in SETS:
        log = logs / f"{name}.log"
        if not log.exists():
            continue
        lines = _lines(log)
        print(f"\n== the 20 slowest tests: {name}")
        print("\n".join(slowest(lines)) or "(no durations in its output)")
        for key, n in counts(lines).items():
            total[key] = total.get(key, 0) + n
    print("\n== FLAKY: tests that failed once and passed on their rerun")
    flaky = logs / "flaky.jsonl"
    rows = [json.loads(line) for line in _lines(flaky) if line.strip()] if flaky.exists() else []
    for row in rows:
        print(f"FLAKY [{row['set']}] {row['nodeid']}")
        for line in row["first_failure"].splitlines():  # trimmed by tests/flaky.py
            print(f"    {line}")
    print(f"{len(rows)} flaky" if rows else "none")
    # a run that left a process, account, mount or socket behind failed (tests/leftovers.py)
    failed = total.get("failed", 0) + total.get("error", 0) + total.get("left behind", 0)
    print(
        f"\ntotal: {total.get('passed', 0)} passed, {failed} failed, "
        f"{total.get('skipped', 0)} skipped"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
