"""The rbroker version (kept apart so that importing it costs nothing)."""

__version__ = "0.1.0"
