"""The event loop a broker runs on: uvloop where it is installed (Linux, macOS; a dependency
there), the standard asyncio loop elsewhere (Windows, where uvloop does not exist) or when
`RBROKER_EVENT_LOOP=asyncio` asks for it. Both run the same code; the test suite runs the
local API's hostile-input tests on each.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

ENV = "RBROKER_EVENT_LOOP"
"""Environment variable: `uvloop`, `asyncio`, or unset/`auto` (uvloop when installed)."""


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of the loop to run (None: asyncio's default).

    Raises:
        ValueError: `RBROKER_EVENT_LOOP` names no known loop, or `uvloop` where it is not
            installed.
    """
    wanted = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if wanted not in ("auto", "uvloop", "asyncio"):
        raise ValueError(f"{ENV}={wanted!r}: use uvloop, asyncio or auto")
    if wanted == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if wanted == "uvloop":
            raise ValueError(f"{ENV}=uvloop, but uvloop is not installed here") from None
        return None
    return uvloop.new_event_loop


def run(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)` on the loop `loop_factory()` chooses.

    Raises:
        ValueError: as `loop_factory`; otherwise whatever `coro` raises.
    """
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(coro)


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """`uvloop` or `asyncio`: what kind of loop `loop` is (shown by `broker.status`)."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
