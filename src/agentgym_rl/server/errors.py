"""How the servers report an environment that raised."""

from __future__ import annotations

from fastapi import HTTPException


def env_failed(error: Exception) -> HTTPException:
    """A 500 whose detail says what the environment raised (the client records it with the episode)."""
    return HTTPException(500, f"the environment raised {type(error).__name__}: {error}")
