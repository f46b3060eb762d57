"""Group-scoped fleet reads: computers with freshness, GPU states and history for charts."""
