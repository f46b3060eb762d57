"""What the SDK, the command line and the tray use to talk to a broker: the one typed client
of the local API (`local.Client`) and where it looks for a broker (`paths.discovery_order`).
It imports only the transport and the wire protocol, never the broker or the local API's
server."""
