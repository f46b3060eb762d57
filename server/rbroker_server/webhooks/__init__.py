"""Coordinator notifications: a group's webhooks, the events found in what the coordinator
already stores (`events`), and their signed, retried, bounded delivery (`sender`)."""
