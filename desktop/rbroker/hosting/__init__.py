"""Hosting a broker (architecture.md §1, §5): a broker and its local API on one event loop
(`host.py`: `rbroker broker`, the service, the tray), that host on a thread of its own
in-process (`embedded.py`: the tray's broker, the demo's), and as a Windows service
(`service_windows.py`, with the access lists of its data folder in `win_acl.py`).

Also here: the machine-wide broker locks a host takes before it opens its data dir or
listens (`machine_lock.py`, picking `machine_lock_linux.py` with the Linux system broker's
`authority.py`, or `machine_lock_windows.py`). What a client reads of them (who holds the
system broker's authority) is the transport's (`rbroker.transport.system_holder`)."""
