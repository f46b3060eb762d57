"""The local broker: capacity model, lease table, FIFO queue and the asyncio service."""
