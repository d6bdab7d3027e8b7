// The voice page: wires the connection, the conversation, the event log and the audio measurements together.
// Plain browser APIs and ES modules: no build step, nothing from a CDN.
import * as advice from "./advice.js";
import { closePeer, NoAddress, openPeer, Refused, servedModel } from "./connection.js";
import { Conversation } from "./conversation.js";
import { EventLog } from "./event_log.js";
import { FirstAudio } from "./first_audio.js";
import { imageDataUrl, imageItem } from "./image_item.js";

const $ = (id) => document.getElementById(id);
const fragment = new URLSearchParams(location.hash.slice(1));
const token = fragment.get("token");  // #token=... (never sent in a URL)
// the server gives up on an unconnected offer after --connect-timeout-s (10 s); #connect_timeout_s=N for slow paths
const CONNECT_TIMEOUT_MS = 1000 * (Number(fragment.get("connect_timeout_s")) || 12);
const MAX_EVENTS = 5000;           // kept for tests and the curious; the log shows them aggregated
const DEFAULT_TEXT = $("text").value;

// window.mstarVoice: the page's state, for tests and curious users
const state = { phase: "disconnected", pc: null, channel: null, pcId: null, events: [], session: null,
  ttfaMs: null, ttfas: [], level: 0, maxLevel: 0, answers: false, notice: null };
window.mstarVoice = state;

const conversation = new Conversation($("conversation"), $("trimmed"));
const log = new EventLog($("log"), $("event-count"));
const firstAudio = new FirstAudio(
  (peak) => { state.level = peak; state.maxLevel = Math.max(state.maxLevel, peak); $("level").value = Math.min(1, peak); },
  (responseId, ms, kind) => {
    state.ttfaMs = ms;
    state.ttfas.push({ response_id: responseId, kind, ms });
    $("ttfa").textContent = `${Math.round(ms)} ms (${kind})`;
    conversation.firstAudio(responseId, ms, kind);
  });

let peer = null;        // {pc, channel, pcId, microphone}
let audioContext = null;
let leaving = false;    // the user (or the page closing) ends the connection: no "dropped" notice
let lastSent = performance.now();
let lastError = null;
let awaitingItem = false;  // a typed message sent as an item: its response.create goes once the server took it

function setPhase(phase, connectionState = phase) {
  state.phase = phase;
  $("state").textContent = connectionState;
  const live = phase === "connecting" || phase === "connected";
  $("connect").disabled = live;       // one peer per page: a second click cannot open a second one
  $("disconnect").disabled = !live;
  $("mic").disabled = live;
  const open = phase === "connected" && peer?.channel.readyState === "open";
  $("speak").disabled = $("interrupt").disabled = !open;
}

function showNotice(notice) {
  state.notice = notice;
  $("notice").hidden = !notice;
  if (!notice) return;
  $("notice-why").textContent = notice.why;
  $("notice-try").replaceChildren(...notice.tries.map((t) => Object.assign(document.createElement("li"), { textContent: t })));
}

function setMic(text) { $("micstate").textContent = text; }

function send(event) {
  if (!peer || peer.channel.readyState !== "open") return;
  lastSent = performance.now();
  peer.channel.send(JSON.stringify(event));
  log.add(event, true);
}

function showModel(name, randomWeights) {
  if (name) $("model").textContent = name;
  if (randomWeights !== undefined) $("weights").hidden = !randomWeights;
}

/** A model that answers (Qwen3-Omni) keeps a conversation; one that speaks the text (Orpheus) does not.
 * The session says so: only a conversation takes items with images (input_image). */
function adaptTo(session) {
  state.answers = conversation.answers = Boolean(session.conversational ?? session.input_image);
  $("imagebox").hidden = !session.input_image;
  const label = state.answers ? "Message" : "Text to speak";
  $("text-label").textContent = label;
  $("text").placeholder = state.answers ? "Type a message to the model" : "Text to speak";
  $("speak").textContent = state.answers ? "Send" : "Speak";
  if (state.answers && $("text").value === DEFAULT_TEXT) $("text").value = "";
}

function onEvent(event) {
  state.events.push(event);
  if (state.events.length > MAX_EVENTS) state.events.splice(0, state.events.length - MAX_EVENTS);
  log.add(event);
  const rid = event.response_id || event.response?.id;
  switch (event.type) {
    case "session.created":
      state.session = event.session;
      adaptTo(event.session);
      showModel($("model").textContent === "-" ? event.session.model : null, event.session.random_weights);
      break;
    case "session.updated":
      state.session = event.session;
      break;
    case "input_audio_buffer.speech_started":
      conversation.speechStarted(event.audio_start_ms);
      if (!peer?.muted) setMic("hearing you");
      break;
    case "input_audio_buffer.speech_stopped":
      conversation.speechStopped(event.audio_end_ms);
      if (!peer?.muted) setMic("listening");
      if (state.answers) firstAudio.arm("spoken");
      else firstAudio.disarm();
      break;
    case "input_audio_buffer.committed":
      conversation.committed(event.audio_ms);
      break;
    case "response.created":
      conversation.replyStarted(rid);
      firstAudio.responseCreated(rid);
      break;
    case "response.output_audio_transcript.delta":
      conversation.delta(rid, event.delta);
      break;
    case "response.output_audio_transcript.done":
      conversation.transcript(rid, event.transcript);
      break;
    case "response.done":
      conversation.done(rid, event.response.status);
      firstAudio.responseDone(rid, event.response.status);
      break;
    case "output_audio_buffer.stopped":
      firstAudio.playedOut(rid);
      break;
    case "conversation.item.created": {
      const parts = event.item?.content || [];
      if (awaitingItem && event.item.role === "user" && parts.some((p) => p.type === "input_text")) {
        awaitingItem = false;  // the server took the typed message: now it answers it
        send({ type: "response.create", response: {} });
      }
      break;
    }
    case "error":
      lastError = event.error?.message || JSON.stringify(event.error);
      conversation.note(lastError);
      if (awaitingItem) { awaitingItem = false; firstAudio.disarm(); }
      break;
  }
}

function onConnectionState(pc) {
  if (!peer || peer.pc !== pc || leaving) return;
  const s = pc.connectionState;
  if (s === "connected") {
    clearTimeout(peer.timer);
    peer.everConnected = true;
    showNotice(null);
    setPhase("connected", s);
  } else if (s === "failed" && !peer.everConnected) {
    fail(advice.neverConnected(Math.round(CONNECT_TIMEOUT_MS / 1000), true), s);
  } else if (s === "failed") {
    fail(advice.dropped(false, (performance.now() - lastSent) / 1000, lastError), "lost");
  } else if (s === "disconnected" && peer.everConnected && !peer.channelClosed) {
    // may recover (the browser keeps checking); said now, cleared if it comes back
    showNotice(advice.dropped(false, (performance.now() - lastSent) / 1000, lastError));
    $("state").textContent = s;
  } else {
    $("state").textContent = s;
  }
}

/** The connection is over for a reason the user did not choose: say why, free the server's slot. */
function fail(notice, connectionState = "failed") {
  const ended = peer;
  peer = null;
  closePeer(ended, token);
  clearTimeout(ended?.timer);
  ended?.microphone?.getTracks().forEach((t) => t.stop());
  firstAudio.disarm();
  awaitingItem = false;
  setMic($("mic").checked ? "off (not connected)" : "off");
  $("mute").hidden = true;
  showNotice(notice);
  setPhase("failed", connectionState);
}

async function microphone() {
  if (!$("mic").checked) { setMic("off"); return null; }
  setMic("asking for permission\u2026");
  try {
    const stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    setMic("listening");
    return stream;
  } catch (error) {
    setMic(advice.microphone(error) + " (connected without it)");
    return null;
  }
}

async function connect() {
  if (peer || state.phase === "connecting") return;
  leaving = false;
  lastError = null;
  showNotice(null);
  setPhase("connecting");
  audioContext = audioContext || new AudioContext();  // on the click: Firefox and Safari keep a later one suspended
  audioContext.resume().catch(() => {});
  state.events = [];
  log.reset();
  conversation.newSession();
  const mic = await microphone();
  let opened;
  try {
    opened = await openPeer({
      microphone: mic, token,
      onTrack: (e) => {
        const stream = e.streams[0] || new MediaStream([e.track]);
        $("audio").srcObject = stream;  // Chromium plays (and decodes) a WebRTC track only once it is attached
        firstAudio.watch(audioContext, stream);
      },
      onChannel: (pc, channel) => {
        state.pc = pc;
        state.channel = channel;
        pc.addEventListener("connectionstatechange", () => onConnectionState(pc));
        channel.onmessage = (m) => onEvent(JSON.parse(m.data));
        channel.onopen = () => setPhase(state.phase, pc.connectionState);
        channel.onclose = () => {
          if (!peer || peer.channel !== channel || leaving) return;
          peer.channelClosed = true;
          fail(advice.dropped(true, (performance.now() - lastSent) / 1000, lastError), "dropped by the server");
        };
      },
    });
  } catch (error) {
    mic?.getTracks().forEach((t) => t.stop());
    peer = null;
    if (error instanceof Refused) fail(advice.refused(error.status, error.text), "refused");
    else if (error instanceof NoAddress) fail(advice.neverConnected(0, false));
    else fail({ why: `The connection could not start: ${error}`, tries: ["Reload the page and connect again."] });
    return;
  }
  peer = { ...opened, microphone: mic, muted: false, everConnected: false, channelClosed: false };
  state.pcId = peer.pcId;
  $("mute").hidden = !mic;
  peer.timer = setTimeout(() => {
    if (peer && !peer.everConnected) fail(advice.neverConnected(Math.round(CONNECT_TIMEOUT_MS / 1000), true));
  }, CONNECT_TIMEOUT_MS);
  onConnectionState(peer.pc);
}

function disconnect() {
  leaving = true;
  const ended = peer;
  peer = null;
  clearTimeout(ended?.timer);
  closePeer(ended, token);
  ended?.microphone?.getTracks().forEach((t) => t.stop());
  firstAudio.disarm();
  awaitingItem = false;
  setMic("off");
  $("mute").hidden = true;
  showNotice(null);
  setPhase("disconnected");
}

function sendTurn() {
  const text = $("text").value.trim();
  if (!text || !peer) return;
  firstAudio.arm("typed");
  conversation.typed(text);
  if (state.answers) {
    $("text").value = "";  // a chat's box empties; a text to speak stays, to be spoken again  // as OpenAI's clients do: the message joins the conversation, then a response answers it
    awaitingItem = true;
    send({ type: "conversation.item.create",
      item: { type: "message", role: "user", content: [{ type: "input_text", text }] } });
  } else {
    send({ type: "response.create", response: { instructions: text } });
  }
}

async function inboundStats() {
  if (!state.pc) return null;
  const report = await state.pc.getStats();
  for (const s of report.values()) if (s.type === "inbound-rtp" && s.kind === "audio")
    return { packetsReceived: s.packetsReceived, totalSamplesReceived: s.totalSamplesReceived };
  return null;
}
window.mstarInboundStats = inboundStats;

$("connect").onclick = () => connect().catch((e) => fail({ why: String(e), tries: ["Reload the page."] }));
$("disconnect").onclick = disconnect;
$("composer").onsubmit = (e) => { e.preventDefault(); sendTurn(); };
$("text").onkeydown = (e) => {  // Enter sends, Shift+Enter is a new line
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing && !$("speak").disabled) { e.preventDefault(); sendTurn(); }
};
$("interrupt").onclick = () => send({ type: "response.cancel" });
$("mute").onclick = () => {
  if (!peer?.microphone) return;
  peer.muted = !peer.muted;
  peer.microphone.getAudioTracks().forEach((t) => { t.enabled = !peer.muted; });
  $("mute").setAttribute("aria-pressed", String(peer.muted));
  $("mute").textContent = peer.muted ? "Unmute" : "Mute";
  setMic(peer.muted ? "muted (the server hears silence)" : "listening");
};
$("image").onchange = (e) => {
  const file = e.target.files[0];
  e.target.value = "";  // the same file picked again is a new item
  if (!file) return;
  imageDataUrl(file).then((url) => { conversation.image(url); send(imageItem(url)); })
    .catch((err) => conversation.note(`image: ${err.message || err}`));
};
window.addEventListener("pagehide", () => { leaving = true; closePeer(peer, token); });

servedModel(token).then((entry) => {
  if (entry) showModel(entry.id, entry.random_weights);
});
$("connect").disabled = false;  // the page is ready
