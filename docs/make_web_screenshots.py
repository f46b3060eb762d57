"""Take the web view's screenshots for the operator guide, and measure its page weight.

Runs a real coordinator and three real brokers (simulated GPUs) with lease workers and a
job, lets them report for about a minute (history every 2 s, so the charts have points),
stops one broker so it shows stale, then signs in with chromium (Playwright) and saves
`docs/web-fleet.png` and `docs/web-computer.png`. It prints the bytes each page transferred
on its first load (Chrome DevTools Protocol `Network.loadingFinished`: headers and bodies
as sent, an empty cache).

    uv run python docs/make_web_screenshots.py [--out DIR] [--seconds 60]
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.conftest import short_tmp, start_broker  # noqa: E402
from tests.e2e.browser import chromium, sign_in  # noqa: E402
from tests.e2e.conftest import WORKER, enroll_cli, py_env, setup_coordinator  # noqa: E402

import rbroker  # noqa: E402

SCENARIOS = {
    "lab-a": """
[[gpu]]
uuid = "GPU-a0000000-0000-0000-0000-000000000001"
name = "Simulated RTX 4090"
total_mib = 24576
used_mib = 900
[[gpu]]
uuid = "GPU-a0000000-0000-0000-0000-000000000002"
name = "Simulated RTX A6000"
total_mib = 49152
used_mib = 600
""",
    "lab-b": """
[[gpu]]
uuid = "GPU-b0000000-0000-0000-0000-000000000001"
name = "Simulated A100 80GB"
total_mib = 81920
used_mib = 22000
""",
    "lab-c": """
[[gpu]]
uuid = "GPU-c0000000-0000-0000-0000-000000000001"
name = "Simulated RTX 3060"
total_mib = 12288
used_mib = 400
""",
}


def worker(socket: str, mib: int, project: str, session: str, purpose: str, use: int) -> Any:
    args = [socket, str(mib), project, session, purpose, str(use)]
    return subprocess.Popen(
        [sys.executable, str(WORKER), *args], stdout=subprocess.DEVNULL, env=py_env()
    )


def page_weight(browser: Any, url: str, token: str, path: str) -> tuple[int, int]:
    """(bytes transferred, requests) for the first load of `path` in a fresh context."""
    context = browser.new_context()
    page = context.new_page()
    sign_in(page, url, token)
    cdp = context.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send("Network.clearBrowserCache")
    seen: list[float] = []
    cdp.on("Network.loadingFinished", lambda e: seen.append(e["encodedDataLength"]))
    page.goto(f"{url}{path}", wait_until="networkidle")
    context.close()
    return int(sum(seen)), len(seen)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=REPO / "docs")
    p.add_argument("--seconds", type=float, default=60.0)
    args = p.parse_args()
    root = short_tmp()
    coordinator = setup_coordinator(
        root, stale_after_s=15.0, offline_after_s=600.0, history_step_s=2.0
    )
    coordinator.start()
    brokers, procs = {}, []
    try:
        for name, scenario in SCENARIOS.items():
            home = root / name
            done = enroll_cli(
                coordinator.url, coordinator.new_code(), home / "data", name, "--key-file"
            )
            assert done.returncode == 0, done.stderr
            brokers[name] = start_broker(scenario, root=home)
        a, b, c = (brokers[n].socket for n in ("lab-a", "lab-b", "lab-c"))
        procs.append(worker(a, 8192, "vision", "run-42", "fine-tune ViT-B", 6000))
        procs.append(worker(b, 40960, "llm", "sft-7", "supervised fine-tune 7B", 40960))
        procs.append(worker(c, 4096, "speech", "eval-3", "evaluate conformer", 2500))
        with rbroker.job(
            project="search", purpose="embed corpus", handler="embed.encode_batch",
            total_items=60_000, workers=4, socket=a,
        ) as job:  # fmt: skip
            start = time.monotonic()
            n = 0
            while time.monotonic() - start < args.seconds:
                job.report(f"chunk-{n}", completed=400, failed=3 if n % 7 == 3 else 0)
                n += 1
                elapsed = time.monotonic() - start
                if n == 10:
                    procs.append(worker(a, 12288, "nlp", "sweep-3", "hyper-parameter sweep", 2048))
                if n == 20:  # fills lab-b's GPU: "full"
                    procs.append(worker(b, 14864, "llm", "eval-2", "evaluate checkpoints", 14000))
                if elapsed > args.seconds - 15 and len(procs) == 5:  # waits, with its reason
                    procs.append(worker(b, 8192, "vision", "run-44", "train detector", 0))
                if elapsed > args.seconds - 25 and brokers["lab-c"].proc.poll() is None:
                    brokers["lab-c"].stop(signal.SIGKILL)
                time.sleep(1.0)
            with chromium() as browser:
                page = browser.new_page(viewport={"width": 1180, "height": 900})
                sign_in(page, coordinator.url, coordinator.token)
                page.wait_for_selector("tr.computer")
                page.screenshot(path=str(args.out / "web-fleet.png"), full_page=True)
                page.get_by_role("link", name="lab-a", exact=True).click()
                page.wait_for_selector("#charts canvas")
                page.screenshot(path=str(args.out / "web-computer.png"), full_page=True)
                for path in ("/fleet", f"/computers/{page.url.rsplit('/', 1)[1]}"):
                    size, count = page_weight(browser, coordinator.url, coordinator.token, path)
                    print(f"first load of {path}: {size:,} bytes in {count} requests")
    finally:
        for proc in procs:
            proc.terminate()
        for bp in brokers.values():
            bp.stop(signal.SIGKILL)
        coordinator.stop()
    print(f"wrote {args.out / 'web-fleet.png'} and {args.out / 'web-computer.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
