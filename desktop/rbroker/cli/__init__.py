"""The `rbroker` command."""
