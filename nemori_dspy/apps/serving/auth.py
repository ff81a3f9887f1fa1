"""Bearer tokens shared by the REST and MCP servers.

The server token (``NEMORI_API_TOKEN``) opens every user's memory. A *user token* opens one user's only:
``user_token(server_token, user_id)`` = ``"nu_"`` + HMAC-SHA256(server token, user id), printed by
``nemori-dspy serve token --user U``. It cannot be turned back into the user id, so a server checks it against the
user a request names (the REST path's ``user_id``, an MCP tool's ``user_id`` argument, or the one user an MCP
server was started for).
"""

from __future__ import annotations

import hashlib
import hmac
import re

__all__ = ["user_token", "is_user_token", "token_opens", "USER_TOKEN_PREFIX"]

USER_TOKEN_PREFIX = "nu_"
_USER_TOKEN = re.compile(r"nu_[0-9a-f]{64}")


def user_token(server_token: str, user_id: str) -> str:
    """The bearer token that opens only ``user_id``'s memory: ``"nu_"`` + HMAC-SHA256(server token, user id)."""
    return USER_TOKEN_PREFIX + hmac.new(server_token.encode(), user_id.encode("utf-8", "surrogatepass"),
                                        hashlib.sha256).hexdigest()


def is_user_token(token: str) -> bool:
    """True if ``token`` has the form of a user token (``nu_`` + 64 hex digits); says nothing of whose."""
    return bool(_USER_TOKEN.fullmatch(token))


def token_opens(server_token: str, given: str, user_id: str) -> bool:
    """True if ``given`` is the server token or ``user_id``'s user token (constant-time comparisons)."""
    if hmac.compare_digest(given.encode(), server_token.encode()):
        return True
    return is_user_token(given) and hmac.compare_digest(given, user_token(server_token, user_id))
