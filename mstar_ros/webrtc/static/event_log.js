// The event log, aggregated: one line per response (its events folded in with counts, not one line per
// transcript delta), and a run of the same event on one line ("x3"). Newest first, bounded.

export const MAX_LINES = 200;

const short = (type) => type.replace(/^response\./, "");

export class EventLog {
  constructor(list, counter) {
    this.list = list;
    this.counter = counter;
    this.count = 0;
    this.byResponse = new Map();  // response id -> {line, kinds: Map(type -> count), status, extra}
    this.last = null;             // {type, line, times} of the newest line that is no response's
    this.t0 = performance.now();
  }

  reset() {
    this.list.replaceChildren();
    this.byResponse.clear();
    this.last = null;
    this.t0 = performance.now();
  }

  _line(text) {
    const line = document.createElement("li");
    line.textContent = text;
    this.list.prepend(line);
    while (this.list.children.length > MAX_LINES) {
      const gone = this.list.lastElementChild;
      for (const [id, entry] of this.byResponse) if (entry.line === gone) this.byResponse.delete(id);
      gone.remove();
    }
    return line;
  }

  _stamp() { return `${((performance.now() - this.t0) / 1000).toFixed(2)} s`; }

  /** One event the page sent (``sent``) or got. */
  add(event, sent = false) {
    this.count += 1;
    this.counter.textContent = `(${this.count})`;
    const rid = event.response_id || (event.type.startsWith("response.") && event.response?.id) || null;
    if (rid && !sent) return this._fold(rid, event);
    const text = sent ? `\u2192 ${event.type}` : event.type === "error" ? `error: ${event.error?.message}` : event.type;
    if (this.last && this.last.text === text && this.last.line.isConnected) {
      this.last.times += 1;
      this.last.line.textContent = `${this.last.stamp} ${text} \u00d7${this.last.times}`;
      return;
    }
    const stamp = this._stamp();
    this.last = { text, times: 1, stamp, line: this._line(`${stamp} ${text}`) };
  }

  _fold(rid, event) {
    let entry = this.byResponse.get(rid);
    if (!entry) {
      entry = { stamp: this._stamp(), kinds: new Map(), chars: 0, status: "in progress", extra: "" };
      entry.line = this._line("");
      this.byResponse.set(rid, entry);
      this.last = null;
    }
    entry.kinds.set(event.type, (entry.kinds.get(event.type) || 0) + 1);
    if (typeof event.delta === "string") entry.chars += event.delta.length;
    if (event.type === "response.done") {
      entry.status = event.response?.status || "done";
      const usage = event.response?.usage;
      if (usage) entry.extra = ` \u00b7 tokens in ${usage.input_tokens ?? "?"} / out ${usage.output_tokens ?? "?"}`;
    }
    const kinds = [...entry.kinds].map(([type, n]) => n > 1 ? `${short(type)} \u00d7${n}` : short(type)).join(", ");
    entry.line.textContent = `${entry.stamp} response ${rid}: ${entry.status}`
      + (entry.chars ? ` \u00b7 ${entry.chars} characters of transcript` : "") + entry.extra + ` \u00b7 ${kinds}`;
  }
}
