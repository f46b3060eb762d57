"""Runs the reporter beside a broker once the data dir holds an enrollment."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from rbroker.broker.service import Broker
from rbroker.uplink.config import UplinkConfig
from rbroker.uplink.enroll import store_for
from rbroker.uplink.keys import KeyStoreError
from rbroker.uplink.reporter import Reporter

log = logging.getLogger(__name__)

CONFIG_POLL_S = 2.0


async def run_uplink(broker: Broker, data_dir: Path) -> None:
    """Wait for `uplink.json` (written by `rbroker enroll`), then report until cancelled.

    A missing or unreadable key never stops the broker: the link state says why.
    """
    state: dict[str, Any] = {"link": "not enrolled", "last_report_at": None}
    broker.uplink_status = lambda: dict(state)
    while True:
        try:
            config = UplinkConfig.load(data_dir)
        except ValueError as exc:
            state.update(link=f"config error: {exc}")
            config = None
        if config is not None:
            try:
                key = await asyncio.to_thread(store_for(config, data_dir).load)
            except KeyStoreError as exc:
                key = None
                state.update(link=f"key unavailable: {exc}", computer_id=config.computer_id)
            if key is None and not state["link"].startswith("key unavailable"):
                state.update(
                    link="key unavailable: the private key is missing",
                    computer_id=config.computer_id,
                )
            if key is not None:
                reporter = Reporter(broker, config, key)
                broker.uplink_status = reporter.status
                log.info("reporting to %s as %s", config.url, config.computer_id)
                await reporter.run()
                return
        await asyncio.sleep(CONFIG_POLL_S)
