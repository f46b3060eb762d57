"""rbroker coordinator: gathers signed reports into group-scoped fleet views (DESIGN §7)."""

__version__ = "0.1.0"
