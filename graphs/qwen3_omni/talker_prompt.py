"""What the Talker is fed, built from the Thinker's rows exactly as the reference builds it.

``thinker_embed`` holds the Thinker's input embeddings (token embeddings, audio embeddings at audio
rows) of the prompt and of every reply token but the last (the Thinker never runs its last token,
so the Talker never sees it: the reference's behaviour, kept); ``thinker_hidden`` the hidden states
after ``accept_hidden_layer`` layers at the same rows.

- user rows: every token of every user turn (from its ``<|im_start|>`` to the next one; system and
  earlier assistant turns are left out), ``hidden_projection(thinker_hidden)`` at audio / image /
  video rows, ``text_projection(thinker_embed)`` at the others;
- 9 assistant rows, from the last ``<|im_start|>assistant``: its first three text rows, four
  ``tts_pad``, ``tts_bos``, the first reply token's row, plus (rows 4-9) the codec embeddings of
  nothink, think_bos, think_eos, the speaker, codec_pad, codec_bos;
- trailing text: the later reply tokens' rows, then ``tts_eos``; ``tts_pad`` after that.

A reply of one token leaves no first reply row: the reference then fails (a size mismatch); here
it is a clear error.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mstar_graphs.qwen3_omni.config import Qwen3OmniConfig

ASSISTANT_ROWS = 9  # the Talker's prompt rows after the user turns


@dataclass
class TalkerInputs:
    prefill: torch.Tensor  # [user rows + 9, H_talker]
    trailing: torch.Tensor  # [reply tokens - 1, H_talker]: the text of each later step, tts_eos last
    tts_pad: torch.Tensor  # [H_talker]: the text of every step after the trailing rows


def user_rows(prompt_ids: list[int], cfg: Qwen3OmniConfig) -> list[int]:
    """Indices of the prompt's user-turn tokens, in order."""
    rows, role = [], None
    for i, t in enumerate(prompt_ids):
        if t == cfg.im_start_token_id:
            role = prompt_ids[i + 1] if i + 1 < len(prompt_ids) else None
        if role == cfg.user_token_id:
            rows.append(i)
    return rows


def assistant_start(prompt_ids: list[int], cfg: Qwen3OmniConfig) -> int:
    starts = [
        i
        for i in range(len(prompt_ids) - 1)
        if prompt_ids[i] == cfg.im_start_token_id and prompt_ids[i + 1] == cfg.assistant_token_id
    ]
    if not starts:
        raise ValueError("the prompt has no '<|im_start|>assistant' turn for the Talker to speak")
    return starts[-1]


@torch.inference_mode()
def talker_inputs(
    talker,
    thinker_embed_tokens,
    cfg: Qwen3OmniConfig,
    prompt_ids: list[int],
    thinker_embed: torch.Tensor,
    thinker_hidden: torch.Tensor,
    speaker: str | int,
) -> TalkerInputs:
    """``talker`` (a :class:`~mstar_graphs.qwen3_omni.talker.Talker`), ``thinker_embed_tokens`` (the
    Thinker's token embedding table), rows [P + reply - 1, H_thinker] -> the Talker's inputs."""
    tc = cfg.talker_config
    speaker_id = speaker_code(cfg, speaker)
    dtype = talker.dtype
    p = len(prompt_ids)
    a = assistant_start(prompt_ids, cfg)
    if thinker_embed.shape[0] < a + 4:
        raise ValueError(
            "the Talker needs at least two reply tokens from the Thinker (one reached it); "
            "the reference fails on a one-token reply too"
        )
    special = thinker_embed_tokens(
        torch.tensor([cfg.tts_bos_token_id, cfg.tts_eos_token_id, cfg.tts_pad_token_id], device=thinker_embed.device)
    )
    tts_bos, tts_eos, tts_pad = talker.text_projection(special.to(dtype)).unbind(0)
    # projected over the whole prompt at once, as the reference does (same matmul shapes, same bits)
    ids = torch.tensor(prompt_ids, device=thinker_embed.device)
    is_media = (ids == tc.audio_token_id) | (ids == tc.image_token_id) | (ids == tc.video_token_id)
    projected = torch.empty(p, text_width(talker), dtype=dtype, device=thinker_embed.device)
    if bool(is_media.any()):
        projected[is_media] = talker.hidden_projection(thinker_hidden[:p][is_media].to(dtype))
    projected[~is_media] = talker.text_projection(thinker_embed[:p][~is_media].to(dtype))
    users = user_rows(prompt_ids, cfg)
    assistant = talker.text_projection(thinker_embed[a:].to(dtype))
    text = torch.cat([assistant[:3], tts_pad.expand(4, -1), tts_bos[None], assistant[3:4]])
    codec = torch.cat(
        [
            torch.zeros(3, text.shape[1], dtype=dtype, device=text.device),
            talker.codec_rows(
                [
                    tc.codec_nothink_id,
                    tc.codec_think_bos_id,
                    tc.codec_think_eos_id,
                    speaker_id,
                    tc.codec_pad_id,
                    tc.codec_bos_id,
                ]
            ).to(dtype),
        ]
    )
    prefill = torch.cat([projected[users], text + codec])
    trailing = torch.cat([assistant[4:], tts_eos[None]])
    return TalkerInputs(prefill, trailing, tts_pad)


def text_width(talker) -> int:
    return talker.text.hidden_size


def speaker_code(cfg: Qwen3OmniConfig, speaker: str | int) -> int:
    """A speaker's codec id, by name (any case) or as the id itself."""
    speakers = {k.lower(): v for k, v in (cfg.talker_config.speaker_id or {}).items()}
    if isinstance(speaker, int) and speaker in speakers.values():
        return speaker
    if isinstance(speaker, str) and speaker.lower() in speakers:
        return speakers[speaker.lower()]
    raise ValueError(f"unknown speaker {speaker!r} (this checkpoint has: {', '.join(sorted(speakers)) or 'none'})")
