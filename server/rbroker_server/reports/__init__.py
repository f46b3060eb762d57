"""Signed reports: verify the envelope, order it by (run, seq), store the latest state."""
