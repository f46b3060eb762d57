"""Runs the reporter beside a broker once the data dir holds an enrollment, and again
from the new enrollment when it changes (`rbroker enroll --new-identity`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rbroker.broker.service import Broker
from rbroker.uplink.config import UnsafeEnrollment, UplinkConfig
from rbroker.uplink.keys import KeyStoreError, PlaintextKeyError
from rbroker.uplink.runs import RunCounter
from rbroker_protocol.results import CoordinatorLink

if TYPE_CHECKING:
    from rbroker.uplink.reporter import Reporter

log = logging.getLogger(__name__)

CONFIG_POLL_S = 2.0
RESTART_S = 30.0
"""Pause before the enrollment is read again after the reporter stopped on an error."""


async def run_uplink(broker: Broker, data_dir: Path) -> None:
    """Wait for `uplink.json` (written by `rbroker enroll`), then report until cancelled;
    a changed or removed `uplink.json` ends the reporter and is read again.

    Each broker start takes the next run counter of the data dir (`rbroker.uplink.runs`)
    for its first run. A missing or unreadable key never stops the broker: the link state
    says why, naming the OS account the broker runs as and the store it asked. While
    reporting, `key` says where the key is. A key found in a plaintext keyring backend is
    not used: the link says so and `warning` carries the fix. An `uplink.json` or key file
    that another account could have written is refused (`UnsafeEnrollment`, POSIX): the
    broker keeps leasing, does not report, and its link state and log (once per line) say
    which file and the fix; one that becomes so while reporting ends the reporter.
    """
    # the link's state while no reporter runs, changed in place (`CoordinatorLink`'s keys)
    state: dict[str, Any] = {"link": "not enrolled", "last_report_at": None}
    broker.set_uplink_status(lambda: _link(state))
    runs = RunCounter(data_dir)
    first_counter: int | None = await asyncio.to_thread(runs.next)  # one per broker start
    refused = ""
    while True:
        try:
            config = UplinkConfig.load(data_dir)
        except UnsafeEnrollment as exc:
            if str(exc) != refused:
                refused = str(exc)
                log.warning("not reporting: %s", exc)
            state.pop("warning", None)
            state.update(link=f"config error: {exc}")
            config = None
        except ValueError as exc:
            state.pop("warning", None)
            state.update(link=f"config error: {exc}")
            config = None
        if config is not None and config.ca_file and not Path(config.ca_file).is_file():
            state.pop("warning", None)
            state.update(
                link=f"config error: the coordinator's CA file {config.ca_file} is missing",
                computer_id=config.computer_id,
            )
            config = None
        if config is not None:
            # httpx (about half of a broker's start-up imports) only for an enrolled broker
            from rbroker.uplink.enroll import store_for
            from rbroker.uplink.reporter import Reporter

            store = store_for(config, data_dir)
            warning = None
            try:
                key = await asyncio.to_thread(store.load)
                why = "" if key is not None else store.missing_message()
            except PlaintextKeyError as exc:
                key, why = None, str(exc)
                warning = f"{exc}. Not reporting until then; leasing goes on"
            except KeyStoreError as exc:
                key, why = None, str(exc)
            if key is None:
                state.pop("warning", None)
                state.update(link=f"key unavailable: {why}", computer_id=config.computer_id)
                if warning:
                    state["warning"] = warning
            if key is not None:
                reporter = Reporter(broker, config, key, runs=runs, run_counter=first_counter)
                first_counter = None  # a later reporter (new enrollment) takes the next one
                where = store.description if config.key_backend != "file" else store.where()
                broker.set_uplink_status(_with_key(reporter.status, where))
                log.info("reporting to %s as %s", config.url, config.computer_id)
                try:
                    await _report_until_changed(reporter, data_dir, config)
                except Exception as exc:  # the broker goes on; the link says why
                    log.exception("reporting to %s stopped", config.url)
                    broker.set_uplink_status(lambda: _link(state))
                    state.pop("warning", None)
                    state.update(
                        link=f"error: {type(exc).__name__}: {exc}"[:300]
                        + f"; trying again in {RESTART_S:g} s",
                        computer_id=config.computer_id,
                    )
                    await asyncio.sleep(RESTART_S)
                    continue
                log.info("the enrollment in %s changed; reading it again", data_dir)
                state.clear()
                state.update(link="not enrolled", last_report_at=None)
                broker.set_uplink_status(lambda: _link(state))
                continue
        await asyncio.sleep(CONFIG_POLL_S)


def _link(state: dict[str, Any]) -> CoordinatorLink:
    """A copy of the link's `state`, whose keys are `CoordinatorLink`'s."""
    return cast(CoordinatorLink, dict(state))


def _with_key(status: Callable[[], CoordinatorLink], where: str) -> Callable[[], CoordinatorLink]:
    """`status` with `key`: where the private key in use lives."""
    return lambda: {**status(), "key": where}


async def _report_until_changed(reporter: Reporter, data_dir: Path, config: UplinkConfig) -> None:
    """Run `reporter` until `data_dir`'s enrollment is no longer `config`.

    Raises:
        Exception: whatever ended the reporter.
    """
    task = asyncio.create_task(reporter.run())
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=CONFIG_POLL_S)
            if done:
                task.result()
                return
            try:
                if UplinkConfig.load(data_dir) != config:
                    return
            except UnsafeEnrollment:
                return  # read again, and refused with the line that says why
            except ValueError:
                pass  # unreadable: keep reporting as enrolled
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
