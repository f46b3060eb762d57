"""`rbroker-server` command (setup, serve, groups, tokens grow with the coordinator issue)."""

from __future__ import annotations

import argparse
import sys

from rbroker_server import __version__


def main(argv: list[str] | None = None) -> int:
    """Entry point of `rbroker-server`."""
    parser = argparse.ArgumentParser(prog="rbroker-server", description="rbroker coordinator")
    parser.add_argument("--version", action="version", version=f"rbroker-server {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the coordinator over HTTP")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8787)
    args = parser.parse_args(argv)
    if args.command == "serve":
        import uvicorn

        from rbroker_server.app import create_app

        uvicorn.run(create_app(), host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
