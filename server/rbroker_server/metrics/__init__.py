"""`/metrics`: a group's fleet in the Prometheus text format."""
