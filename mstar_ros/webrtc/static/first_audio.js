// The output level, and each reply's time to first audio as the user hears it: from the moment the turn was
// sent (typed) or its end was detected (spoken: input_audio_buffer.speech_stopped) to the first audible
// output, measured on the decoded audio itself (an AnalyserNode on the received track).

export const AUDIBLE = 0.001;  // a peak above digital silence (the gateway's idle frames decode to zeros)

export class FirstAudio {
  constructor(onLevel, onFirstAudio) {
    this.onLevel = onLevel;            // (peak) each tick
    this.onFirstAudio = onFirstAudio;  // (responseId, ms, kind) once per reply
    this.pending = null;               // {kind, t0, responseId, quietSeen}
    this.maxLevel = 0;
  }

  /** A turn was sent (``typed``) or ended (``spoken``) at ``t0``: its reply's first audio is timed from it. */
  arm(kind, t0 = performance.now()) { this.pending = { kind, t0, responseId: null, quietSeen: false }; }

  /** The reply to the armed turn began. */
  responseCreated(id) {
    if (this.pending && this.pending.responseId === null) this.pending.responseId = id;
  }

  /** A reply ended: one cut off before its audio is not timed. A completed one may still be on its way (its
   * audio plays out after response.done): it is timed until output_audio_buffer.stopped says it played. */
  responseDone(id, status) {
    if (status !== "completed" && this.pending && this.pending.responseId === id) this.pending = null;
  }

  playedOut(id) {
    if (this.pending && this.pending.responseId === id) this.pending = null;
  }

  disarm() { this.pending = null; }

  _tick(peak) {
    this.maxLevel = Math.max(this.maxLevel, peak);
    this.onLevel(peak);
    const p = this.pending;
    if (!p) return;
    // the tail of a reply cut off by this turn may still be playing: count audio only after a quiet moment
    // since the turn; that moment may come before response.created does (events and audio travel apart).
    // Audio heard before response.created is not timed (it could be that tail): the reply is then timed
    // from its first audible frame after the event, late by the event's lag (milliseconds on a link)
    if (peak <= AUDIBLE) p.quietSeen = true;
    else if (p.quietSeen && p.responseId !== null) {
      this.pending = null;
      this.onFirstAudio(p.responseId, performance.now() - p.t0, p.kind);
    }
  }

  /** Watch ``stream`` (the received audio) on ``context``, every animation frame. */
  watch(context, stream) {
    const analyser = context.createAnalyser();
    analyser.fftSize = 1024;  // ~21 ms at 48 kHz: each frame (~17 ms apart) sees every sample
    context.createMediaStreamSource(stream).connect(analyser);
    const data = new Float32Array(analyser.fftSize);
    const tick = () => {
      analyser.getFloatTimeDomainData(data);
      let peak = 0;
      for (const v of data) peak = Math.max(peak, Math.abs(v));
      this._tick(peak);
      this.frame = requestAnimationFrame(tick);
    };
    tick();
  }

  stop() { if (this.frame) cancelAnimationFrame(this.frame); }
}
