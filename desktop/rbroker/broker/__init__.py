"""The local broker: capacity model, the lessor (the leases), FIFO queue and the asyncio service."""
