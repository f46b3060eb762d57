"""A real browser for the web view's tests: Debian's chromium driven by Playwright.

`chromium()` yields a launched browser (headless, `--no-sandbox` when running as root,
where chromium's sandbox refuses to start) or skips the test when no chromium is
installed (`apt-get install chromium`; `.ci/run` installs it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM = (
    os.environ.get("RBROKER_TEST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
)


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless chromium (a playwright `Browser`); closed on exit."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium)")
    args = ["--no-sandbox"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=args)
        try:
            yield browser
        finally:
            browser.close()


def sign_in(page: Any, url: str, token: str) -> None:
    """Open `url`/fleet (redirected to the sign-in form), type the token, submit."""
    page.goto(f"{url}/fleet")
    assert page.url.endswith("/signin"), page.url
    page.get_by_label("Viewer token").fill(token)
    page.get_by_role("button", name="Sign in").click()
