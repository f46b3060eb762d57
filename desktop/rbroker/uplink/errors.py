"""Errors of the coordinator link in the user's words, with a hint for each interface.

A network or HTTP failure becomes a sentence that says what went wrong (`the host name
rbroker.example.org is unknown`) and a hint of what to do. The hint comes in two forms: the
command line's, which may name a flag (`pass --ca-file with its tls/ca.pem`), and the tray's,
which names the Settings control instead and never a flag. `str(error)` is the command line
form; `error.for_gui()` the tray's.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx


class UplinkError(RuntimeError):
    """A coordinator operation failed. `message` says what; `cli_hint` / `gui_hint` (may be
    empty) what to do on the command line / in the tray."""

    def __init__(self, message: str, cli_hint: str = "", gui_hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.cli_hint = cli_hint
        self.gui_hint = cli_hint if gui_hint is None else gui_hint

    def __str__(self) -> str:
        return self.message + (f" ({self.cli_hint})" if self.cli_hint else "")

    def for_gui(self) -> str:
        """The message with the tray's hint (no command-line flags)."""
        return self.message + (f" ({self.gui_hint})" if self.gui_hint else "")


def network_error(exc: httpx.HTTPError, url: str) -> tuple[str, str, str]:
    """(message, CLI hint, GUI hint) for an httpx failure reaching `url`.

    Recognised: a certificate the system does not trust (self-signed coordinator), plain
    HTTP sent to an HTTPS server (the server drops the connection), HTTPS sent to a plain
    HTTP port (`WRONG_VERSION_NUMBER`), an unknown host name, a refused connection, and a
    timeout; anything else keeps httpx's own text."""
    parts = urlsplit(url)
    host = parts.hostname or url
    where = f"{host}:{parts.port}" if parts.port else host
    text = str(exc)
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return (
            f"cannot reach the coordinator at {url}: its certificate is not trusted here: {text}",
            "a self-signed coordinator: pass --ca-file with its tls/ca.pem",
            "a self-signed coordinator: choose its CA file (tls/ca.pem) in Settings",
        )
    if "WRONG_VERSION_NUMBER" in text or "record layer failure" in text:
        hint = f"this port does not speak HTTPS; check the port, or use http://{where}"
        return (f"cannot talk HTTPS to {where}", hint, hint)
    if parts.scheme == "http" and isinstance(exc, httpx.ReadError | httpx.RemoteProtocolError):
        hint = f"if the coordinator serves HTTPS (the default), use https://{where}"
        return (f"{where} dropped the plain-HTTP request", hint, hint)
    if isinstance(exc, httpx.ConnectError) and any(
        s in text
        for s in (
            "Name or service not known",
            "nodename nor servname",
            "getaddrinfo failed",
            "Temporary failure in name resolution",
            "No address associated with hostname",
        )
    ):
        hint = "check the spelling of the URL, or use the coordinator's IP address"
        return (f"the host name {host} is unknown", hint, hint)
    if isinstance(exc, httpx.ConnectError) and "Connection refused" in text:
        hint = "is the coordinator running, and is the port right?"
        return (f"nothing accepts connections at {where}", hint, hint)
    if isinstance(exc, httpx.TimeoutException):
        hint = "is the host up, and does a firewall let the port through?"
        return (f"no answer from {where} in time", hint, hint)
    return (f"cannot reach the coordinator at {url}: {text or type(exc).__name__}", "", "")


def detail_of(response: httpx.Response) -> str:
    """The server's `detail` text of an error answer, else its first 300 characters."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    if isinstance(body, dict) and body.get("detail"):
        return str(body["detail"])[:300]
    return response.text[:300]
