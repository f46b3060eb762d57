"""The local API: transports (Unix socket, Windows named pipe), JSON-RPC dispatch, client."""
