"""The local API's server: JSON-RPC 2.0 over the transport, dispatched onto the `Broker`
façade (`server.py`), with one connection and its own limits (`connection.py`), the limits
of one user's connections together (`limits.py`), who the peer process is (`identity.py`),
who may connect (`access.py`) and the events sent to connections (`holder_events.py`). The
client is `rbroker.client`; the OS channel is `rbroker.transport`."""
