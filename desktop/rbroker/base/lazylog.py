"""A module's logger that loads `logging` with its first message (start-up, docs/architecture.md
§10, issue 44): the SDK, the client and `rbroker run` log only when something goes wrong, yet
importing `logging` (with traceback, linecache, tokenize, string and weakref) is a measurable
part of a short command's start (bench/RESULTS.md, start-up). What is logged goes through
`logging` as before: the real logger of the same name (`logging.getLogger(name)`), with its
levels, handlers and filters, and the caller's file and line on each record.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING's idiom (PEP 484): no `typing` at run time
if TYPE_CHECKING:
    import logging
    from typing import Any


class Logger:
    """`logging.getLogger(name)` made on the first message (or `real`); the methods a module
    logs with pass their arguments on unchanged. Two threads that log first at once get the
    same logger; add filters before the threads start."""

    __slots__ = ("_filters", "_real", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._real: logging.Logger | None = None
        self._filters: list[Any] = []

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
