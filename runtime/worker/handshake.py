"""The Conductor <-> Worker handshake proofs: each side shows it holds the pool's token.

    Conductor -> Worker   Challenge(nonce_c)
    Worker -> Conductor   Hello(rank, pid, host, nonce_w, HMAC(token, "worker-hello" | nonce_c | nonce_w | rank pid host))
    Conductor -> Worker   Welcome(HMAC(token, "conductor-welcome" | nonce_w | nonce_c)), then Setup

The Worker proves first, so a peer without the token never gets a Conductor's proof to
study; the Conductor's proof answers the Worker's fresh nonce, so a recorded Welcome is
worth nothing later. The labels differ from the tensor servers' ("client" / "server"),
which share the token: no proof made for one purpose passes for another.
"""

from __future__ import annotations

from mstar.transport.auth import NONCE_BYTES, new_nonce, proof, proof_matches
from mstar.worker.protocol import Challenge, Hello, Welcome


def _identity(rank: int, pid: int, host: str) -> bytes:
    return f"{rank}|{pid}|{host}".encode()


def challenge() -> Challenge:
    return Challenge(new_nonce())


def hello(token: str, challenge: Challenge, rank: int, pid: int, host: str) -> Hello:
    if len(challenge.nonce) != NONCE_BYTES:
        raise ConnectionError(
            f"the conductor's challenge has a {len(challenge.nonce)}-byte nonce, expected {NONCE_BYTES}"
        )
    nonce = new_nonce()
    mac = proof(token.encode(), b"worker-hello", challenge.nonce, nonce, _identity(rank, pid, host))
    return Hello(rank, pid, host, nonce, mac)


def hello_is_valid(token: str, challenge: Challenge, hello: Hello) -> bool:
    return len(hello.nonce) == NONCE_BYTES and proof_matches(
        hello.proof,
        token.encode(),
        b"worker-hello",
        challenge.nonce,
        hello.nonce,
        _identity(hello.rank, hello.pid, hello.host),
    )


def welcome(token: str, challenge: Challenge, hello: Hello) -> Welcome:
    return Welcome(proof(token.encode(), b"conductor-welcome", hello.nonce, challenge.nonce))


def welcome_is_valid(token: str, challenge: Challenge, hello: Hello, welcome: Welcome) -> bool:
    return proof_matches(welcome.proof, token.encode(), b"conductor-welcome", hello.nonce, challenge.nonce)
