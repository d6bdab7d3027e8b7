// One peer connection to the gateway: the offer over HTTP (POST /offer), the data channel "oai-events" as
// OpenAI's WebRTC transport names it, and DELETE /offer/PC_ID to end it, so the server's slot is free at once.

const GATHER_MS = 3000;  // host candidates come in milliseconds; STUN/TURN, which would take longer, are not used

/** The browser found no address to offer (Chromium leaves loopback out by default): no use asking the server. */
export class NoAddress extends Error {}

export class Refused extends Error {
  constructor(status, text) { super(`refused: ${status} ${text}`); this.status = status; this.text = text; }
}

function headers(token, json = true) {
  const h = json ? { "Content-Type": "application/json" } : {};
  if (token) h["Authorization"] = "Bearer " + token;
  return h;
}

/** The served model's entry in GET /v1/models, or null (a page may load before the server is reachable). */
export async function servedModel(token) {
  try {
    const reply = await fetch("v1/models", { headers: headers(token, false) });
    if (!reply.ok) return null;
    return (await reply.json()).data?.[0] || null;
  } catch {
    return null;
  }
}

/** A connected RTCPeerConnection's parts once the server answered: {pc, channel, pcId}.
 * ``microphone``: a MediaStream to send, or null for receive-only. Throws Refused when the server says no,
 * NoAddress when the browser has no address to connect from. */
export async function openPeer({ microphone, token, onTrack, onChannel }) {
  const pc = new RTCPeerConnection({ iceServers: [] });  // no STUN/TURN: host candidates only
  pc.ontrack = onTrack;
  if (microphone) microphone.getTracks().forEach((t) => pc.addTrack(t, microphone));
  else pc.addTransceiver("audio", { direction: "recvonly" });
  const channel = pc.createDataChannel("oai-events");
  onChannel(pc, channel);
  try {
    await pc.setLocalDescription(await pc.createOffer());
    await new Promise((resolve) => {  // all host candidates in the offer (no trickle)
      if (pc.iceGatheringState === "complete") return resolve();
      pc.addEventListener("icegatheringstatechange", () => pc.iceGatheringState === "complete" && resolve());
      // with no interface it may use (Chromium leaves loopback out), gathering never completes: go with what came
      setTimeout(resolve, GATHER_MS);
    });
    const offer = pc.localDescription;
    if (!/\na=candidate:/.test(offer.sdp)) throw new NoAddress("the browser offered no ICE candidate");
    let reply;
    try {
      reply = await fetch("offer", { method: "POST", headers: headers(token),
        body: JSON.stringify({ sdp: offer.sdp, type: offer.type }) });
    } catch (error) {
      throw new Refused(0, String(error.message || error));
    }
    if (!reply.ok) throw new Refused(reply.status, await reply.text());
    const answer = await reply.json();
    await pc.setRemoteDescription({ sdp: answer.sdp, type: answer.type });
    return { pc, channel, pcId: answer.pc_id };
  } catch (error) {
    pc.close();
    throw error;
  }
}

/** Ends the peer here and on the server (``keepalive``: also when the page is going away). */
export function closePeer(peer, token) {
  if (!peer) return;
  if (peer.pcId) fetch(`offer/${encodeURIComponent(peer.pcId)}`,
    { method: "DELETE", headers: headers(token, false), keepalive: true }).catch(() => {});
  peer.channel?.close();
  peer.pc.close();
}
