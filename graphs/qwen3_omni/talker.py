"""The Talker: codec code 0 of each 80 ms frame from the Thinker's text, and its code predictor.

An MoE decoder whose every layer has a shared expert (sigmoid-gated), over input *embeddings*:

- prefill (what the reference builds): the user turns' rows, ``text_projection`` of the Thinker's
  token embeddings (``hidden_projection`` of its layer-``accept_hidden_layer`` hidden states at
  audio / image rows); then 9 assistant rows: ``<|im_start|>``, ``assistant``, ``\\n`` as text; four
  ``tts_pad`` text rows plus the codec's nothink / think_bos / think_eos / speaker ids; ``tts_pad`` +
  ``codec_pad``; ``tts_bos`` + ``codec_bos``... the last with the first reply token's text row.
- each later step: the sum of the previous frame's 16 codec embeddings (code 0's from
  ``model.codec_embedding``, the residual ones from the code predictor's tables) plus the next
  reply token's text row, then ``tts_eos``, then ``tts_pad`` until codec EOS, or until the reply's audio
  cap (``talker_cap``: frames by the text's length; the reference has none below 4096).

``codec_head`` gives code 0 (codes ``[vocab - 1024, vocab)`` other than codec EOS are never
sampled, as the reference suppresses them); :class:`CodePredictor` gives codes 1-15.
Module names are the checkpoint's under ``talker.``.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from mstar.engine.ar_module import FeedbackCall
from mstar.engine.attention.backend import AttentionContext
from mstar_graphs.qwen3_omni.code_predictor import CodePredictor
from mstar_graphs.qwen3_omni.config import Qwen3OmniConfig
from mstar_graphs.qwen3_omni.decoder import DecoderARModule, DecoderStack
from mstar_graphs.qwen3_omni.talker_cap import cap_note, frame_cap, step_cap

log = logging.getLogger("mstar_graphs.qwen3_omni")

SUPPRESSED_TAIL = 1024  # the codec vocabulary's last 1024 ids (special codes), EOS excepted


class ResizeMLP(nn.Module):
    """Thinker width -> Talker width: fc1, SiLU, fc2 (both with bias)."""

    def __init__(self, cin: int, inner: int, cout: int, **factory) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(cin, inner, **factory)
        self.linear_fc2 = nn.Linear(inner, cout, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class Talker(DecoderARModule):
    plain_linears = ("codec_head",)
    prompt_in_history = False  # the reference's repetition penalty sees only generated code-0 tokens
    has_feedback = True  # a frame's next input is its 16 code embeddings plus the next text row

    def __init__(
        self, config: Qwen3OmniConfig, *, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
    ) -> None:
        super().__init__()
        self.config = config
        tc = config.talker_config
        text = tc.text_config
        self.text = text
        factory = {"dtype": dtype, "device": device}
        self.model = DecoderStack(text, lambda _: True, **factory)  # every layer: MoE + shared expert
        self.model.codec_embedding = nn.Embedding(text.vocab_size, text.hidden_size, **factory)
        self.codec_head = nn.Linear(text.hidden_size, text.vocab_size, bias=False, **factory)
        self.text_projection = ResizeMLP(tc.thinker_hidden_size, text.intermediate_size, text.hidden_size, **factory)
        self.hidden_projection = ResizeMLP(tc.thinker_hidden_size, text.intermediate_size, text.hidden_size, **factory)
        self.code_predictor = CodePredictor(tc.code_predictor_config, tc.num_code_groups, **factory)

    # -- ARModule: rows enter as embeddings (embed_mask), else as code-0 ids ------------------------------
    def allowed_token_ranges(self, num_generated: int) -> list[tuple[int, int]] | None:
        eos, vocab = self.config.talker_config.codec_eos_token_id, self.text.vocab_size
        ranges = [(0, vocab - SUPPRESSED_TAIL)]
        if eos >= vocab - SUPPRESSED_TAIL:
            ranges.append((eos, eos + 1))
        return ranges

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,  # type: ignore[override]
        attn: AttentionContext,
        embeds: torch.Tensor | None = None,
        embed_mask: torch.Tensor | None = None,
        rope_positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        self._positions_check(input_ids, positions)
        h = self.rows(self.model.codec_embedding, input_ids, embeds, embed_mask)
        cos, sin = self.cos_sin(positions, rope_positions, h.dtype)
        out, _ = self.model.run(h, cos, sin, attn)
        return out

    def compute_logits(self, hidden: torch.Tensor, token_ids: torch.Tensor | None = None) -> torch.Tensor:
        if token_ids is None:
            return self.codec_head(hidden)
        return hidden @ self.codec_head.weight.index_select(0, token_ids).T

    def feedback_ready(self, call) -> bool:
        """A Talker streamed the Thinker's reply (``reply_rows`` fed) reads reply row ``iteration + 1``
        after the frame it samples: it waits for that row unless the reply has ended."""
        if "trailing" in call.inputs or "reply_rows" not in call.open_inputs:
            return True
        rows = call.inputs.get("reply_rows")
        return rows is not None and call.iteration + 1 < rows.shape[0]

    def loop_limit(self, call: FeedbackCall) -> int | None:
        """The reply's audio cap (mstar_graphs.qwen3_omni.talker_cap), once its text is known."""
        text = self._capped_text(call)
        return None if text is None else step_cap(text)

    @staticmethod
    def _capped_text(call: FeedbackCall) -> int | None:
        """The text rows the capped call reads: known from the start with ``trailing``, else when the reply's
        stream ends (until then no cap is needed: the Talker reads reply row i + 1 after frame i, so it
        cannot outrun the text). None: not known yet, or no ``audio_cap`` (the request turned it off)."""
        if "audio_cap" not in call.inputs:
            return None
        if "trailing" in call.inputs:
            return call.inputs["trailing"].shape[0]
        if "reply_rows" in call.open_inputs:
            return None
        rows = call.inputs.get("reply_rows")
        return 0 if rows is None else rows.shape[0]

    def feedback(self, hidden: torch.Tensor, tokens: torch.Tensor, calls) -> tuple[torch.Tensor, list[dict]]:
        """The code predictor for the step's frames (one per sequence), and each one's next input row:
        the frame's 16 code embeddings summed, plus the next text row. Output ``frame``: the frame's 16 codes.

        The text row of iteration i: row i of ``trailing`` (the reply's later rows, projected, ``tts_eos``
        last), then ``tts_pad``; or, for a Talker streamed the reply as it is made (``reply_rows``: the
        Thinker's rows of the reply tokens, the first one's in the prefill), ``text_projection`` of reply
        row i + 1, ``tts_eos`` once the reply has ended, then ``tts_pad``. Output ``audio_capped`` with the
        last frame the reply's audio cap allows."""
        code0 = self.model.codec_embedding(tokens)
        residual, frame_embeds = self.code_predictor.predict(
            hidden.to(code0.dtype), code0, [not c.greedy for c in calls], [c.generator for c in calls]
        )
        rows = self.next_input(frame_embeds, self._text_rows(calls, code0.dtype, code0.device))
        frames = torch.cat([tokens[:, None], residual], dim=1)
        return rows, [self._frame_outputs(c, f) for c, f in zip(calls, frames)]

    def _frame_outputs(self, call: FeedbackCall, frame: torch.Tensor) -> dict[str, torch.Tensor]:
        """Output ``frame``; with the last frame the reply's audio cap allows, also ``audio_capped``
        ([frames, text tokens]), and a log line: the served output says the cap cut it."""
        text = self._capped_text(call)
        if text is None or step_cap(text) != call.iteration + 2:
            return {"frame": frame}
        log.info("Qwen3-Omni Talker: %s", cap_note(text, frame_cap(text)))
        return {"frame": frame, "audio_capped": torch.tensor([frame_cap(text), text])}

    def _text_rows(self, calls, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        texts: list[torch.Tensor | None] = []
        streamed: list[tuple[int, torch.Tensor]] = []  # reply rows to project, in one batch
        width = self.config.talker_config.thinker_hidden_size
        for c in calls:
            pad = c.inputs["tts_pad"].reshape(-1)
            if "trailing" in c.inputs:
                trailing = c.inputs["trailing"]
                texts.append(trailing[c.iteration] if c.iteration < trailing.shape[0] else pad)
                continue
            reply = c.inputs.get("reply_rows")
            have, k = (0 if reply is None else reply.shape[0]), c.iteration + 1
            if k < have:
                streamed.append((len(texts), reply[k, :width]))
                texts.append(None)
            elif "reply_rows" in c.open_inputs:
                raise RuntimeError(f"the Talker's text row {k} has not arrived (feedback_ready was not asked)")
            else:
                texts.append(c.inputs["tts_eos"].reshape(-1) if k == have else pad)
        if streamed:
            projected = self.text_projection(torch.stack([r for _, r in streamed]).to(device=device, dtype=dtype))
            for (i, _), row in zip(streamed, projected):
                texts[i] = row
        return torch.stack([t.to(device=device, dtype=dtype) for t in texts])  # type: ignore[union-attr]

    # -- the rows the reference feeds -------------------------------------------------------------------
    def codec_rows(self, ids: list[int]) -> torch.Tensor:
        return self.model.codec_embedding(torch.tensor(ids, device=self.model.norm.weight.device))

    def next_input(self, frame_embeds: torch.Tensor, text_row: torch.Tensor) -> torch.Tensor:
        """frame_embeds [B, groups, H] (code 0's, then the residual codes') + text rows [B, H] -> [B, H]."""
        return frame_embeds.sum(1) + text_row
