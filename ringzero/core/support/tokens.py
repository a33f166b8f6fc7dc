"""Bearer tokens of ringzero's servers (the MCP server over HTTP, ``ringzero ui``): one rule for
what a token given to them must be."""

from __future__ import annotations

from ringzero.core.contract.errors import InvalidArgument

__all__ = ["MIN_TOKEN", "check_token"]

MIN_TOKEN = 16
"""The fewest characters a bearer token may have: a blank or short one is guessed."""


def check_token(token: str, where: str = "the bearer token") -> str:
    """``token``, refused (InvalidArgument naming ``where``) where it is blank, has white
    space, or is shorter than ``MIN_TOKEN``."""
    if not isinstance(token, str) or len(token) < MIN_TOKEN or any(c.isspace() for c in token):
        raise InvalidArgument(f"{where} must be at least {MIN_TOKEN} characters without white space "
                              "(generate one: python -c 'import secrets; print(secrets.token_urlsafe(32))')")
    return token
