"""rbroker coordinator: gathers signed reports into group-scoped fleet views (architecture.md
§7)."""

__version__ = "0.1.0"
