"""The coordinator's enrollment (`POST /api/v1/enroll`, architecture.md §7): what a computer
sends to join a group and what it gets back."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class EnrollRequest(BaseModel):
    """A computer asks to join the group its enrollment code belongs to."""

    model_config = ConfigDict(extra="forbid")

    code: Annotated[str, Field(min_length=1, max_length=200)]
    name: Annotated[str, Field(min_length=1, max_length=128)]
    """The computer's display name."""
    public_key: Annotated[str, Field(min_length=40, max_length=64)]
    """Base64 of the 32-byte Ed25519 public key."""


class EnrollResponse(BaseModel):
    """The new computer's id (used in every signed envelope) and its group."""

    computer_id: str
    group: str


__all__ = ["EnrollRequest", "EnrollResponse"]
