"""The gateway's Bearer token: where it comes from, and how a request's ``Authorization`` header is judged.

The token is read from ``--token-file`` or ``$MSTAR_GATEWAY_TOKEN`` (as the Worker pool's token is read
from the environment): ``--token`` still works, with a warning, since every user of the host sees a
process's argv in ``ps``. A header is ``Bearer <token>`` with the scheme in any case (RFC 9110: schemes
are case-insensitive); a header without the scheme, or with bytes that are not ASCII, is refused (401).
"""

from __future__ import annotations

import hmac
import logging
import os
import stat
from pathlib import Path

TOKEN_ENV = "MSTAR_GATEWAY_TOKEN"
log = logging.getLogger("mstar_ros.webrtc")


def gateway_token(
    flag: str | None = None, file: Path | None = None, environ: dict[str, str] | os._Environ = os.environ
) -> str | None:
    """The token from at most one of ``--token``, ``--token-file`` and ``$MSTAR_GATEWAY_TOKEN``; None without any."""
    given = [
        name
        for name, value in (("--token", flag), ("--token-file", file), (f"${TOKEN_ENV}", environ.get(TOKEN_ENV)))
        if value
    ]
    if len(given) > 1:
        raise ValueError(f"the gateway token is given twice ({' and '.join(given)}): give one")
    if flag:
        log.warning(
            "--token is visible to every user of this host (ps shows argv): use --token-file FILE or $%s instead",
            TOKEN_ENV,
        )
        token = flag
    elif file:
        token = _read_token_file(Path(file))
    else:
        token = environ.get(TOKEN_ENV)
    if token is not None and (not token.strip() or not token.isascii() or any(c.isspace() for c in token.strip())):
        raise ValueError(f"the gateway token ({given[0]}) must be non-empty printable ASCII without spaces")
    return token.strip() if token is not None else None


def _read_token_file(file: Path) -> str:
    try:
        text = file.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--token-file {file}: cannot read it: {exc}") from None
    if file.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("--token-file %s can be read by other users (chmod 600 it)", file)
    return text.strip()


def bearer_token(header: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (any case of the scheme); None otherwise."""
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def authorised(header: str, token: str) -> bool:
    given = bearer_token(header)
    if given is None or not given.isascii():  # aiohttp keeps a non-UTF-8 header's bytes as surrogates
        return False
    return hmac.compare_digest(given.encode(), token.encode())
