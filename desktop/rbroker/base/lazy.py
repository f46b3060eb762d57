"""Loading on first use in a short command-line client (start-up, docs/architecture.md §10,
issue 44).

A command that sends the local broker a few requests and exits (`rbroker run`, `rbroker
status`, …) calls `quick_start()` before it imports the client: the client and the SDK then
load what only some calls need (logging, the wire's error codes) when a call first needs
it, and frame their messages with the standard library's json instead of orjson (which,
with the dataclasses, inspect, uuid and datetime it imports, costs more to load than a few
messages save). Any other process (a job with the SDK, the tray, the broker) loads all of it
with the modules that use it, as before `quick_start` existed: a process that imports the SDK
and then drops its privileges, or can no longer read its interpreter's directory, imports
nothing afterwards.

`Logger` is a module's logger on these terms: in a quick start it loads `logging` with its
first message; what is logged goes through `logging` as always (the real logger of the same
name, its levels, handlers and filters, the caller's file and line on each record).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING's idiom (PEP 484): no `typing` at run time
if TYPE_CHECKING:
    import logging
    from typing import Any


_quick = False


def quick_start() -> None:
    """This process is a short command-line client: from now on, modules load on first use
    and new clients frame messages with the standard library's json (the module doc). Call it
    before importing `rbroker.client.local` and the SDK's modules."""
    global _quick
    _quick = True


def is_quick() -> bool:
    """Whether `quick_start()` was called in this process."""
    return _quick


class Logger:
    """`logging.getLogger(name)`, made with this object unless in a quick start, where the
    first message (or `real`) makes it; the methods a module logs with pass their arguments
    on unchanged. Two threads that log first at once get the same logger; add filters before
    the threads start."""

    __slots__ = ("_filters", "_real", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._real: logging.Logger | None = None
        self._filters: list[Any] = []
        if not _quick:
            self.real  # noqa: B018 - made now: nothing is imported after the process starts

    @property
    def real(self) -> logging.Logger:
        """The logger itself, made now with the filters added before (`addFilter`)."""
        if self._real is None:
            import logging

            logger = logging.getLogger(self.name)
            for f in self._filters:
                logger.addFilter(f)  # a filter already there is not added twice
            self._real = logger
        return self._real

    def addFilter(self, filter: Any) -> None:  # logging.Logger's name
        """`logging.Logger.addFilter`, kept until the logger is made when it is not yet."""
        if self._real is None:
            self._filters.append(filter)
        else:
            self._real.addFilter(filter)

    def debug(self, msg: object, *args: object, **kwargs: Any) -> None:
        self.real.debug(msg, *args, **_one_frame_up(kwargs))

    def info(self, msg: object, *args: object, **kwargs: Any) -> None:
        self.real.info(msg, *args, **_one_frame_up(kwargs))

    def warning(self, msg: object, *args: object, **kwargs: Any) -> None:
        self.real.warning(msg, *args, **_one_frame_up(kwargs))

    def error(self, msg: object, *args: object, **kwargs: Any) -> None:
        self.real.error(msg, *args, **_one_frame_up(kwargs))

    def exception(self, msg: object, *args: object, **kwargs: Any) -> None:
        """`logging.Logger.exception`: call it from an exception handler."""
        self.real.exception(msg, *args, **_one_frame_up(kwargs))


def _one_frame_up(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` with `stacklevel` one more: the record names the caller's file, line and
    function, not this module's."""
    kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 1
    return kwargs
