"""Administration of groups, viewer tokens, enrollment codes and computers (the CLI's core)."""
