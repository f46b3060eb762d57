"""The local-API protocol version: one integer, history in comments, fields only added.

History:
    1 (2026-11-30): hello, gpus.list, lease.acquire/renew/release, leases.list,
                    broker.status, sim.allocate, sim.free, sim.set.
"""

PROTOCOL_VERSION = 1
"""The version this build speaks."""

PROTOCOL_VERSION_MIN = 1
"""The oldest client version the broker still answers; older `hello`s get `protocol_version`."""
