"""Litestar app factory. Settings are passed in, never read at import time."""

from __future__ import annotations

from dataclasses import dataclass

from litestar import Litestar, get


@dataclass(frozen=True, slots=True)
class Settings:
    """Coordinator settings (grows with the coordinator issue)."""

    database_url: str = "sqlite:///rbroker-server.db"


@get("/healthz", sync_to_thread=False)
def healthz() -> dict[str, str]:
    """Liveness probe: `{"status": "ok"}`."""
    return {"status": "ok"}


def create_app(settings: Settings | None = None) -> Litestar:
    """Build the coordinator app from `settings` (defaults when None)."""
    app = Litestar(route_handlers=[healthz])
    app.state.settings = settings or Settings()
    return app
