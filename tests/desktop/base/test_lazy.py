"""`rbroker.base.lazy.Logger` logs through `logging` as `logging.getLogger(name)` does: the
same logger, the caller's place on each record, filters added before the first message kept,
an exception's traceback with `exception`; made with the object, or in a quick start (a short
command-line client) with the first message."""

from __future__ import annotations

import logging

import pytest

from rbroker.base import lazy
from rbroker.base.lazy import Logger

NAME = "rbroker.tests.lazylog"


def test_a_message_goes_through_the_real_logger_with_the_callers_place(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = Logger(NAME)
    with caplog.at_level(logging.INFO, logger=NAME):
        log.info("lease %s re-attached", "lease-1")
        log.debug("not shown at INFO")
    assert log.real is logging.getLogger(NAME)
    (record,) = caplog.records
    assert (record.name, record.levelname, record.getMessage()) == (
        NAME,
        "INFO",
        "lease lease-1 re-attached",
    )
    assert record.funcName == "test_a_message_goes_through_the_real_logger_with_the_callers_place"
    assert record.pathname == __file__


def test_a_filter_added_before_the_first_message_is_kept(caplog: pytest.LogCaptureFixture) -> None:
    log = Logger(NAME + ".filtered")

    def not_marked(record: logging.LogRecord) -> bool:
        return not getattr(record, "marked", False)

    log.addFilter(not_marked)
    log.addFilter(not_marked)  # once is enough: logging keeps one
    with caplog.at_level(logging.WARNING, logger=log.name):
        log.warning("said", extra={"marked": False})
        log.error("kept back", extra={"marked": True})
    assert [r.getMessage() for r in caplog.records] == ["said"]
    assert logging.getLogger(log.name).filters == [not_marked]
    log.addFilter(logging.Filter(NAME))  # after the logger is made: added to it at once
    assert len(logging.getLogger(log.name).filters) == 2


def test_exception_logs_the_traceback(caplog: pytest.LogCaptureFixture) -> None:
    log = Logger(NAME + ".exc")
    with caplog.at_level(logging.ERROR, logger=log.name):
        try:
            raise ValueError("hook broke")
        except ValueError:
            log.exception("event hook failed")
    (record,) = caplog.records
    assert record.getMessage() == "event hook failed" and record.levelname == "ERROR"
    assert record.exc_info is not None and record.exc_info[0] is ValueError
    assert record.funcName == "test_exception_logs_the_traceback"


def test_in_a_quick_start_the_logger_is_made_by_the_first_message(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(lazy, "_quick", False)  # a job (restored after the test)
    assert Logger(NAME + ".eager")._real is not None  # made now
    lazy.quick_start()
    assert lazy.is_quick()
    log = Logger(NAME + ".quick")
    assert log._real is None
    with caplog.at_level(logging.WARNING, logger=log.name):
        log.warning("now")
    assert log._real is logging.getLogger(log.name)
    assert [r.getMessage() for r in caplog.records] == ["now"]
