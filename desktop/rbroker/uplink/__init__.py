"""Uplink: enrollment, key storage and signed reports from a broker to the coordinator.

Reporting is never permission: nothing here touches the leases, and coordinator or
network outages only change the link state (architecture.md §7).
"""

import logging

HTTP_CLIENT_LOGGERS = ("httpx", "httpcore")
"""Loggers of the HTTP client: at INFO httpx logs every request (one line per report)."""


def quiet_http_client_logs() -> None:
    """Keep the HTTP client's loggers to warnings (the reporter logs what matters about the
    link: unreachable, rejected, reachable again). Called by the programs that configure
    logging (`rbroker broker`, `rbroker tray`), never on import."""
    for name in HTTP_CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
