"""Demo worlds and the local coordinator they report to.

`rbroker demo` (cli) and the tray's screenshot tool drive what lives here; the end-to-end
tests and the benchmarks start their coordinators with `coordinator.LocalCoordinator` too.
Nothing here imports the server: the coordinator runs as `python -m rbroker_server`.
"""
