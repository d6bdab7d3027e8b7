"""Qwen3-Omni end to end in one process with our modules and dense caches, one request at a time.

What the reference's ``generate(return_audio=True)`` computes, step by step: the Thinker's prompt
(with the audio encoder's rows at ``<|audio_pad|>``) and greedy reply; the Talker's inputs from the
Thinker's rows (mstar_graphs.qwen3_omni.talker_prompt); the Talker's loop (code 0 with the
repetition penalty over earlier code-0 tokens and the special codes suppressed, the code predictor
for codes 1-15, the next input from the frame's embeddings plus the next text row); Code2Wav in
chunks with left context. The served graph computes the same with the runtime's engines; this is
the yardstick its tests compare with, and the parity tests compare this with transformers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mstar_graphs.qwen3_omni.code_predictor import DenseCausalCache
from mstar_graphs.qwen3_omni.talker_cap import step_cap
from mstar_graphs.qwen3_omni.talker_prompt import talker_inputs


@dataclass
class OmniReply:
    text_ids: list[int]  # the Thinker's reply
    codes: torch.Tensor  # [num_code_groups, frames]
    audio: torch.Tensor | None  # [samples] float, or None without Code2Wav


def penalise(logits: torch.Tensor, history: list[int], penalty: float) -> torch.Tensor:
    """transformers' repetition penalty: earlier tokens' logits divided (if > 0) or multiplied by it."""
    if penalty == 1.0 or not history:
        return logits
    ids = torch.tensor(sorted(set(history)))
    picked = logits[ids]
    logits = logits.clone()
    logits[ids] = torch.where(picked > 0, picked / penalty, picked * penalty)
    return logits


@torch.inference_mode()
def generate(
    thinker,
    talker,
    code2wav,
    prompt_ids: list[int],
    *,
    audio_rows: torch.Tensor | None = None,
    thinker_max_new_tokens: int = 32,
    talker_max_new_tokens: int = 64,
    speaker: str = "ethan",
    eos_token_id: int | None = None,
    repetition_penalty: float = 1.05,
    chunk: int = 300,
    left_context: int = 25,
    audio_cap: bool = True,
) -> OmniReply:
    """Greedy Thinker and Talker (the code predictor greedy too), as ``generate(..., talker_do_sample=False)``;
    ``audio_cap``: the Talker's frames also capped by the reply's text (``talker_cap``), as served."""
    cfg = thinker.config
    eos = cfg.im_end_token_id if eos_token_id is None else eos_token_id
    ids = torch.tensor(prompt_ids)
    mask = ids == cfg.thinker_config.audio_token_id
    embeds = None
    if bool(mask.any()):
        if audio_rows is None or audio_rows.shape[0] != int(mask.sum()):
            raise ValueError(f"the prompt has {int(mask.sum())} audio tokens; audio_rows must have as many rows")
        embeds = torch.zeros(len(ids), audio_rows.shape[1])
        embeds[mask] = audio_rows
    kv = DenseCausalCache(1)
    hidden = thinker(ids, torch.arange(len(ids)), kv, embeds=embeds, embed_mask=mask)
    rows_embed, rows_hidden = [thinker.embedded], [thinker.captured]
    reply: list[int] = []
    position = len(ids)
    while True:
        token = int(thinker.compute_logits(hidden[-1:]).argmax(-1))
        reply.append(token)
        if token == eos or len(reply) >= thinker_max_new_tokens:
            break
        hidden = thinker(torch.tensor([token]), torch.tensor([position]), kv)
        rows_embed.append(thinker.embedded)
        rows_hidden.append(thinker.captured)
        position += 1
    inputs = talker_inputs(
        talker, thinker.model.embed_tokens, cfg, prompt_ids, torch.cat(rows_embed), torch.cat(rows_hidden), speaker
    )
    codes = talk(talker, inputs, talker_max_new_tokens, repetition_penalty, audio_cap)
    audio = None
    if code2wav is not None and codes.shape[1]:
        audio = chunked_decode(code2wav, codes, chunk, left_context)
    return OmniReply(reply, codes, audio)


def talk(talker, inputs, max_new_tokens: int, repetition_penalty: float, audio_cap: bool = True) -> torch.Tensor:
    """The Talker's greedy loop -> codes [groups, frames] (the last sampled code 0 never gets a frame).
    ``audio_cap``: at most ``talker_cap.step_cap`` samples for the text rows it reads (``trailing``'s)."""
    tc = talker.config.talker_config
    if audio_cap:
        max_new_tokens = min(max_new_tokens, step_cap(inputs.trailing.shape[0]))
    allowed = torch.zeros(talker.vocab_size, dtype=torch.bool)
    for lo, hi in talker.allowed_token_ranges(0):
        allowed[lo:hi] = True
    kv = DenseCausalCache(1)
    n = inputs.prefill.shape[0]
    hidden = talker(
        torch.zeros(n, dtype=torch.long),
        torch.arange(n),
        kv,
        embeds=inputs.prefill,
        embed_mask=torch.ones(n, dtype=torch.bool),
    )
    history: list[int] = []
    frames = []
    position = n
    while True:
        logits = penalise(talker.compute_logits(hidden[-1:])[0].float(), history, repetition_penalty)
        code0 = int(logits.masked_fill(~allowed, float("-inf")).argmax())
        history.append(code0)
        if code0 == tc.codec_eos_token_id or len(history) >= max_new_tokens:
            break
        c0 = torch.tensor([code0])
        residual, frame_embeds = talker.code_predictor.predict(
            hidden[-1:], talker.model.codec_embedding(c0), [False], [None]
        )
        frames.append(torch.cat([c0, residual[0]]))
        step = len(frames) - 1
        text = inputs.trailing[step] if step < inputs.trailing.shape[0] else inputs.tts_pad
        x = talker.next_input(frame_embeds, text[None])
        hidden = talker(
            torch.zeros(1, dtype=torch.long),
            torch.tensor([position]),
            kv,
            embeds=x,
            embed_mask=torch.ones(1, dtype=torch.bool),
        )
        position += 1
    if not frames:
        return torch.zeros(tc.num_code_groups, 0, dtype=torch.long)
    return torch.stack(frames, dim=1)


def chunked_decode(code2wav, codes: torch.Tensor, chunk: int, left_context: int) -> torch.Tensor:
    """codes [groups, frames] -> samples, chunk by chunk with ``left_context`` frames before each."""
    outs, start, frames = [], 0, codes.shape[1]
    while start < frames:
        end = min(start + chunk, frames)
        context = left_context if start - left_context > 0 else start
        outs.append(code2wav.decode_chunk(codes[None, :, start - context : end], context)[0, 0])
        start = end
    return torch.cat(outs)
