// The conversation view: the user's turns (typed, spoken, images) and the model's replies as they stream.

export const MAX_TURNS = 60;  // older turns leave the page: a long session stays light (the server bounds its own)

const seconds = (ms) => (ms / 1000).toFixed(2);

export class Conversation {
  constructor(root, trimmedNote) {
    this.root = root;
    this.trimmedNote = trimmedNote;
    this.trimmed = 0;
    this.replies = new Map();   // response id -> its turn
    this.spoken = null;         // the spoken turn being said now
    this.answers = false;       // the model answers (else it speaks the typed text)
  }

  _turn(role, who) {
    this.root.querySelector(".empty")?.remove();
    const follow = this.root.scrollHeight - this.root.scrollTop - this.root.clientHeight < 40;
    const turn = document.createElement("article");
    turn.className = `turn ${role}`;
    const head = document.createElement("p");
    head.className = "who";
    head.textContent = who;
    const text = document.createElement("p");
    text.className = "text";
    const meta = document.createElement("p");
    meta.className = "meta";
    turn.append(head, text, meta);
    this.root.append(turn);
    while (this.root.querySelectorAll(".turn").length > MAX_TURNS) {
      const oldest = this.root.querySelector(".turn");
      for (const [id, t] of this.replies) if (t === oldest) this.replies.delete(id);
      oldest.remove();
      this.trimmed += 1;
    }
    if (this.trimmed) {
      this.trimmedNote.hidden = false;
      this.trimmedNote.textContent = `${this.trimmed} earlier turn${this.trimmed > 1 ? "s" : ""} no longer shown.`;
    }
    if (follow) this.root.scrollTop = this.root.scrollHeight;  // keep up unless the user scrolled back
    return turn;
  }

  _meta(turn, text) { turn.querySelector(".meta").textContent = text; }

  _tag(turn, text) {
    const tag = document.createElement("span");
    tag.className = "tag";
    tag.textContent = text;
    turn.querySelector(".who").append(tag);
  }

  typed(text) {
    const turn = this._turn("user", this.answers ? "You (typed)" : "You (to speak)");
    turn.dataset.kind = "typed";
    turn.querySelector(".text").textContent = text;
    return turn;
  }

  image(url) {
    const turn = this._turn("user", "You (image)");
    turn.dataset.kind = "image";
    const img = document.createElement("img");
    img.src = url;
    img.alt = "the image you showed";
    turn.querySelector(".text").append(img);
    return turn;
  }

  /** The VAD heard speech start at ``ms`` into the microphone's stream. */
  speechStarted(ms) {
    const turn = this._turn("user", "You (spoken)");
    turn.dataset.kind = "spoken";
    turn.dataset.status = "speaking";
    turn.dataset.startMs = ms;
    turn.querySelector(".text").textContent = "speaking\u2026";
    this.spoken = turn;
  }

  /** The VAD ended the turn: its segment of the microphone's stream. */
  speechStopped(ms) {
    const turn = this.spoken;
    if (!turn) return;
    const start = Number(turn.dataset.startMs);
    turn.dataset.status = "spoken";
    turn.dataset.endMs = ms;
    turn.querySelector(".text").textContent =
      `spoken: ${seconds(start)}\u2013${seconds(ms)} s of the microphone (${seconds(ms - start)} s)`;
    if (!this.answers) this._meta(turn, "heard, not answered: this model speaks typed text");
    this.spoken = null;
    return turn;
  }

  committed(audioMs) {
    const turn = [...this.root.querySelectorAll(".turn.user[data-kind=spoken]")].pop();
    if (turn && audioMs !== undefined) this._meta(turn, `${seconds(audioMs)} s of audio sent to the model`);
  }

  replyStarted(id) {
    const turn = this._turn("assistant", this.answers ? "Model" : "Model (speaking)");
    turn.dataset.status = "streaming";
    turn.dataset.responseId = id;
    this.replies.set(id, turn);
    return turn;
  }

  delta(id, text) {
    const turn = this.replies.get(id);
    if (turn) turn.querySelector(".text").textContent += text;
  }

  /** The reply's whole text (the server's final transcript) where the deltas missed some. */
  transcript(id, text) {
    const turn = this.replies.get(id);
    if (turn && typeof text === "string") turn.querySelector(".text").textContent = text;
  }

  /** ``status``: completed, cancelled (cut off: barge-in, interrupt, a new turn) or failed. */
  done(id, status) {
    const turn = this.replies.get(id);
    if (!turn) return;
    turn.dataset.status = status === "cancelled" ? "cut-off" : status;
    if (status === "cancelled") this._tag(turn, "cut off");
    if (status === "failed") this._tag(turn, "failed");
    if (status !== "completed" && !turn.querySelector(".text").textContent) turn.querySelector(".text").textContent = "(no words yet)";
  }

  firstAudio(id, ms, kind) {
    const turn = this.replies.get(id);
    if (turn) {
      turn.dataset.ttfaMs = Math.round(ms);
      const after = kind === "spoken" ? "the end of your turn was detected" : "you sent it";
      this._meta(turn, `first audio ${Math.round(ms)} ms after ${after}`);
    }
  }

  /** A new connection is a new session: the model no longer remembers the turns above. */
  newSession() {
    if (!this.root.querySelector(".turn")) return;
    const turn = this._turn("divider", "");
    turn.querySelector(".text").textContent = "New connection: a new conversation starts here.";
  }

  note(text) {
    const turn = this._turn("note", "Error");
    turn.querySelector(".text").textContent = text;
  }
}
