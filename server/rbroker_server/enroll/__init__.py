"""Enrollment: a one-time code and a computer's Ed25519 public key become a computer id."""
