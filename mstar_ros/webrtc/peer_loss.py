"""Why a peer was lost, in one log line: a peer that stopped answering ICE consent checks (RFC 7675).

aioice ends a connection whose consent checks go unanswered ("Consent to send expired", logged at
INFO by aioice itself), and the peer's ICE transport goes from completed to failed (the only way it
fails once connected; the peer connection itself may read "closed" by then, as it closes itself once its
DTLS transport has gone). That happens to a tab
killed without a goodbye, a network that went away, and also to a live peer on a host too busy to answer
in time (the checks run on the gateway's event loop): the line names the peer, the cause and what to try.
"""

from __future__ import annotations

import logging

log = logging.getLogger("mstar_ros.webrtc")


def consent_window_s() -> float:
    """About how long consent may go unanswered before aioice ends the connection (as configure_ice set it)."""
    import aioice.ice
    import aioice.stun

    return aioice.ice.CONSENT_FAILURES * (aioice.ice.CONSENT_INTERVAL * 1.2 + aioice.stun.RETRY_RTO)


def ice_transport_states(pc) -> set[str]:
    """The states of a peer connection's ICE transports (through its senders' and SCTP's DTLS transports)."""
    dtls = {t.sender.transport for t in pc.getTransceivers() if t.sender.transport is not None}
    if pc.sctp is not None:
        dtls.add(pc.sctp.transport)
    return {d.transport.state for d in dtls}


class LossReport:
    def __init__(self, peer_id: str) -> None:
        self.peer_id = peer_id
        self.connected = False
        self.reported: str | None = None  # the line logged, once

    def ice_state(self, pc, responding: str | None = None) -> None:
        """The peer connection's ICE state changed; ``responding``: the response under way, if any."""
        states = ice_transport_states(pc)
        if "completed" in states:
            self.connected = True
        elif "failed" in states and self.connected and self.reported is None:
            during = f" during response {responding}" if responding else ""
            self.reported = (
                f"peer {self.peer_id}: lost{during}: ICE consent expired (no answer to connectivity "
                f"checks for ~{consent_window_s():.1f} s): its tab or network went away, or this host "
                "was too busy to answer in time; if live peers drop under load, try a larger "
                "--peer-lost-s (e.g. 5)"
            )
            log.warning(self.reported)
