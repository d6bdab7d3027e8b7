"""Orpheus's token ids and how its audio tokens encode SNAC codes.

The Orpheus LLM (a Llama 3.2 3B fine-tune) extends the Llama 3 vocabulary
(128256 ids) with ``<custom_token_N>`` = id 128256 + N. Tokens 1..6 mark turns
and speech; audio codes start at custom token 10. The generated audio stream is
a sequence of 7-token frames; the token at stream index ``i`` carries one code
(0..4095) of SNAC level ``SLOT_LEVELS[i % 7]`` and lives in its own id window:
``id = 128266 + code + (i % 7) * 4096``.

All ranges here are half-open: ``(lo, hi)`` means ``lo <= id < hi``.
"""

from __future__ import annotations

from functools import lru_cache

import torch

LLAMA3_VOCAB = 128256
CUSTOM_TOKEN_BASE = LLAMA3_VOCAB  # <custom_token_N> has id CUSTOM_TOKEN_BASE + N

BEGIN_OF_TEXT = 128000  # <|begin_of_text|>, the Llama 3 BOS the text tokenizer prepends
EOT = 128009  # <|eot_id|>
START_OF_SPEECH = 128257  # <custom_token_1>
END_OF_SPEECH = 128258  # <custom_token_2>
START_OF_HUMAN = 128259  # <custom_token_3>
END_OF_HUMAN = 128260  # <custom_token_4>
START_OF_AI = 128261  # <custom_token_5>
END_OF_AI = 128262  # <custom_token_6>
PAD = 128263  # <custom_token_7>

AUDIO_TOKEN_BASE = CUSTOM_TOKEN_BASE + 10  # 128266: code 0 of slot 0
CODEBOOK_SIZE = 4096
FRAME_TOKENS = 7
AUDIO_TOKEN_END = AUDIO_TOKEN_BASE + FRAME_TOKENS * CODEBOOK_SIZE  # 156938, one past the last audio id
VOCAB_SIZE = 156940  # the Orpheus checkpoints' embedding rows

# SNAC level of each slot of a frame: one level-0 code, two level-1, four level-2.
SLOT_LEVELS = (0, 1, 2, 2, 1, 2, 2)
# Slots in the order their codes appear within one frame's share of each level.
LEVEL_SLOTS = ((0,), (1, 4), (2, 3, 5, 6))


def _check_slot(slot: int) -> None:
    if not 0 <= slot < FRAME_TOKENS:
        raise ValueError(f"slot must be in 0..{FRAME_TOKENS - 1}, got {slot}")


def audio_token(code: int, slot: int) -> int:
    """The token id that carries SNAC ``code`` at frame position ``slot``."""
    _check_slot(slot)
    if not 0 <= code < CODEBOOK_SIZE:
        raise ValueError(f"code must be in 0..{CODEBOOK_SIZE - 1}, got {code}")
    return AUDIO_TOKEN_BASE + slot * CODEBOOK_SIZE + code


def slot_token_range(slot: int) -> tuple[int, int]:
    """Half-open id range ``(lo, hi)`` of the audio tokens allowed at frame position ``slot``."""
    _check_slot(slot)
    lo = AUDIO_TOKEN_BASE + slot * CODEBOOK_SIZE
    return lo, lo + CODEBOOK_SIZE


def allowed_token_ranges(num_generated: int) -> list[tuple[int, int]]:
    """Constrained decoding: the half-open id ranges allowed for the next token.

    ``num_generated`` counts the audio tokens generated so far. The next token must
    be an audio token of slot ``num_generated % 7``; at a frame boundary (slot 0)
    END_OF_SPEECH is allowed too, so speech only ever ends on a whole frame.
    """
    if num_generated < 0:
        raise ValueError(f"num_generated must be >= 0, got {num_generated}")
    slot = num_generated % FRAME_TOKENS
    ranges = [slot_token_range(slot)]
    if slot == 0:
        ranges.append((END_OF_SPEECH, END_OF_SPEECH + 1))
    return ranges


@lru_cache(maxsize=2 * FRAME_TOKENS)
def _allowed_ids_cpu(slot: int) -> torch.Tensor:
    ranges = allowed_token_ranges(slot)
    return torch.cat([torch.arange(lo, hi, dtype=torch.int64) for lo, hi in sorted(ranges)])


def allowed_token_ids(num_generated: int) -> torch.Tensor:
    """``allowed_token_ranges`` as a sorted int64 id tensor (cached per slot; do not modify it)."""
    if num_generated < 0:
        raise ValueError(f"num_generated must be >= 0, got {num_generated}")
    return _allowed_ids_cpu(num_generated % FRAME_TOKENS)


def _slot_offsets(device: torch.device) -> torch.Tensor:
    return AUDIO_TOKEN_BASE + CODEBOOK_SIZE * torch.arange(FRAME_TOKENS, dtype=torch.int64, device=device)


def tokens_to_snac_codes(token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Audio token ids ``[..., 7F]`` (whole frames) -> SNAC codes ``([..., F], [..., 2F], [..., 4F])``.

    Batched over leading dims. Raises ValueError naming the first offending token
    (its position in the last dim, its slot and its value) if a token is outside
    its slot's range.
    """
    if token_ids.dim() == 0 or token_ids.shape[-1] % FRAME_TOKENS:
        raise ValueError(
            f"token_ids: last dim must be a multiple of {FRAME_TOKENS} (whole frames), "
            f"got shape {tuple(token_ids.shape)}"
        )
    if token_ids.dtype.is_floating_point or token_ids.dtype == torch.bool:
        raise ValueError(f"token_ids: expected an integer tensor, got {token_ids.dtype}")
    lead = token_ids.shape[:-1]
    frames = token_ids.shape[-1] // FRAME_TOKENS
    codes = token_ids.to(torch.int64).reshape(*lead, frames, FRAME_TOKENS) - _slot_offsets(token_ids.device)
    bad = (codes < 0) | (codes >= CODEBOOK_SIZE)
    if bool(bad.any()):
        flat = bad.reshape(-1, frames * FRAME_TOKENS)
        row = int(flat.any(dim=1).nonzero()[0])
        pos = int(flat[row].nonzero()[0])
        value = int(token_ids.reshape(-1, frames * FRAME_TOKENS)[row, pos])
        slot = pos % FRAME_TOKENS
        lo, hi = slot_token_range(slot)
        where = f"position {pos}" if not lead else f"row {row}, position {pos}"
        raise ValueError(f"token_ids: {where} (slot {slot}) holds {value}, outside that slot's range [{lo}, {hi})")
    return tuple(  # type: ignore[return-value]
        codes[..., list(slots)].reshape(*lead, frames * len(slots)) for slots in LEVEL_SLOTS
    )


def snac_codes_to_tokens(c0: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`tokens_to_snac_codes`: codes ``[..., F], [..., 2F], [..., 4F]`` -> ids ``[..., 7F]``."""
    frames = c0.shape[-1]
    lead = c0.shape[:-1]
    for name, codes, per in (("c1", c1, 2), ("c2", c2, 4)):
        if codes.shape != (*lead, per * frames):
            raise ValueError(
                f"{name}: expected shape {(*lead, per * frames)} for {frames} frames, got {tuple(codes.shape)}"
            )
    for name, codes in (("c0", c0), ("c1", c1), ("c2", c2)):
        if bool(((codes < 0) | (codes >= CODEBOOK_SIZE)).any()):
            raise ValueError(f"{name}: codes must be in 0..{CODEBOOK_SIZE - 1}")
    out = torch.empty(*lead, frames, FRAME_TOKENS, dtype=torch.int64, device=c0.device)
    for level, codes in enumerate((c0, c1, c2)):
        slots = list(LEVEL_SLOTS[level])
        out[..., slots] = codes.to(torch.int64).reshape(*lead, frames, len(slots))
    return (out + _slot_offsets(c0.device)).reshape(*lead, frames * FRAME_TOKENS)
