"""The local API's server: JSON-RPC 2.0 over the transport, dispatched onto the `Broker`
façade (`server.py`), with the connections' limits, who may connect and the events sent to
them. The client is `rbroker.client`; the OS channel is `rbroker.transport`."""
