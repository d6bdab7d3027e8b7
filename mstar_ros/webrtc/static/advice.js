// What went wrong with a connection, said so a person can act on it: {why, tries: [what to try, ...]}.
// The causes here are the ones seen on these gateways; each message says "likely" where the page cannot know.

const onLoopback = () => ["127.0.0.1", "localhost", "[::1]"].includes(location.hostname)
  || location.hostname.startsWith("127.");
const isFirefox = () => /firefox/i.test(navigator.userAgent);

// Browsers leave loopback out of ICE by default: a page on 127.0.0.1 then never connects.
function loopbackTries() {
  const chromium = "Chromium / Chrome: start it with --allow-loopback-in-peer-connection.";
  const firefox = "Firefox: set media.peerconnection.ice.loopback to true in about:config "
    + "(and, on a machine without a default route, media.peerconnection.ice.default_address_only to false).";
  const other = "Or serve on an address of this host instead of loopback: "
    + "mstar-ros serve voice --host ADDR --token-file FILE, and open http://ADDR:PORT/#token=TOKEN.";
  return isFirefox() ? [firefox, chromium, other] : [chromium, firefox, other];
}

/** The offer was refused over HTTP (status and the server's text), or never reached the server (status 0). */
export function refused(status, text) {
  const said = (text || "").trim().slice(0, 300);
  if (status === 0) return { why: `The server did not answer at ${location.origin} (${said || "network error"}).`,
    tries: ["Check that mstar-ros serve voice is running, and that this is the URL it printed."] };
  if (status === 401) return { why: "The server wants a token (it serves a host other than loopback).",
    tries: ["Open the page as http://HOST:PORT/#token=TOKEN, with the token the server was given "
      + "(--token-file or $MSTAR_GATEWAY_TOKEN)."] };
  if (status === 503 && /peers/.test(said)) return { why: `The server is full: ${said}.`,
    tries: ["Disconnect another tab or client, or restart the server with a larger --max-peers."] };
  if (status === 503) return { why: `The server is busy: ${said || status}.`, tries: ["Connect again in a moment."] };
  return { why: `The server refused the connection (${status}): ${said}`, tries: ["Reload the page and connect again."] };
}

/** ICE did not complete: no network path between this browser and the server. */
export function neverConnected(seconds, offeredAddresses) {
  const why = offeredAddresses
    ? `No connection after ${seconds} s: the browser and the server found no network path (ICE did not complete).`
    : "This browser offered no network address to connect on, so ICE cannot complete.";
  const tries = onLoopback() ? loopbackTries()
    : ["Check that this browser can reach the server's address over UDP (no firewall in between).",
      "The gateway offers no STUN or TURN: browser and server must be on one network."];
  return { why, tries };
}

/** A connected peer lost its connection: ``closedByServer`` when the server ended it (the data channel
 * closed), else it stopped answering ICE checks. ``idleS``: seconds since this page last sent anything. */
export function dropped(closedByServer, idleS, lastError) {
  const tries = ["Connect again.",
    "If it happens often, start the server with --peer-lost-s 5 (it drops a peer after 1.5 s of missed checks by "
    + "default), or with --placement so that the model runs off the process that serves the peers."];
  let why;
  if (lastError) why = `The server ended this connection after an error: ${lastError}`;
  else if (idleS >= 290) why = "The server ended this connection after 5 minutes without activity (its idle timeout).";
  else if (closedByServer) why = "The server ended this connection. Likely cause: it missed this page's ICE consent "
    + "checks for --peer-lost-s, e.g. while under load, and took the page for gone; or it was stopped.";
  else why = "The server stopped answering (no reply to ICE consent checks). Likely cause: it was stopped, "
    + "or it is too loaded to answer.";
  return { why, tries };
}

/** The microphone could not be opened: the page connects without it. */
export function microphone(error) {
  if (!window.isSecureContext || !navigator.mediaDevices)
    return "unavailable: a browser gives the microphone only to https:// or localhost pages";
  if (error.name === "NotAllowedError") return "blocked: allow the microphone for this site, then connect again";
  if (error.name === "NotFoundError") return "none found: connect one, then connect again";
  return `unavailable: ${error.name}: ${error.message}`;
}
