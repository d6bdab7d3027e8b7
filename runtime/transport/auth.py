"""Proof of a shared secret by HMAC-SHA256 over both sides' nonces: the secret never crosses the wire.

Used by the TCP tensor servers and by the Conductor <-> Worker handshake. Each side
picks a fresh nonce; a proof is HMAC(secret, label | nonces...), with a different label
per direction, so a proof one side sends can never be replayed (or reflected) as the
other side's.
"""

from __future__ import annotations

import hashlib
import hmac
import os

NONCE_BYTES = 16
PROOF_BYTES = hashlib.sha256().digest_size
MIN_SECRET_BYTES = 8


def new_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


def proof(secret: bytes, label: bytes, *parts: bytes) -> bytes:
    # fixed-size nonces and a trailing variable part at most: the concatenation is unambiguous
    return hmac.new(secret, label + b"".join(parts), hashlib.sha256).digest()


def proof_matches(got: bytes, secret: bytes, label: bytes, *parts: bytes) -> bool:
    return hmac.compare_digest(bytes(got), proof(secret, label, *parts))


def check_secret(secret: bytes, what: str = "the tensor server") -> bytes:
    if not isinstance(secret, (bytes, bytearray)) or len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"{what} needs a shared secret of at least {MIN_SECRET_BYTES} bytes (the Worker pool's token)")
    return bytes(secret)
