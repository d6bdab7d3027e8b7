"""The offline Orpheus pipeline a CPU user would write: transformers generate() + the snac package.

The numerical reference in tests and the baseline in ``mstar-ros bench orpheus``.
Needs the ``bench`` / ``test`` extras (transformers, snac).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from mstar.weights import iter_checkpoint_tensors
from mstar_graphs.orpheus.graph import STRIDE_TOKENS, WINDOW_TOKENS
from mstar_graphs.orpheus.snac_stage import window_noise_seed
from mstar_graphs.orpheus.tokens import END_OF_SPEECH, allowed_token_ids, tokens_to_snac_codes


def load_hf_llm(path: Path, dtype: torch.dtype = torch.float32):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype).eval()


def load_reference_snac(path: Path):
    import snac

    config = json.loads((path / "config.json").read_text())
    kwargs = {k: v for k, v in config.items() if k in snac.SNAC.__init__.__code__.co_varnames}
    model = snac.SNAC(**kwargs)
    model.load_state_dict(dict(iter_checkpoint_tensors(path)))
    return model.eval()


class AudioSlotLogitsProcessor:
    """The same constrained-decoding rule as OrpheusLLM, as a vectorized HF logits processor
    (what a careful user would write; prefix_allowed_tokens_fn builds Python lists per row)."""

    def __init__(self, prompt_len: int, vocab_size: int) -> None:
        self.prompt_len = prompt_len
        self.masks = []
        for n in range(8):  # slots 0..6, plus "first token" (n == 0 forbids end-of-speech)
            allowed = torch.zeros(vocab_size, dtype=torch.bool)
            ids = allowed_token_ids(0 if n == 7 else n)
            allowed[ids] = True
            if n == 0:
                allowed[END_OF_SPEECH] = False
            self.masks.append(allowed)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        n = input_ids.shape[-1] - self.prompt_len
        if self.masks[0].device != scores.device:  # once, on the model's device
            self.masks = [m.to(scores.device) for m in self.masks]
        mask = self.masks[0] if n == 0 else self.masks[7 if n % 7 == 0 else n % 7]
        return scores.masked_fill(~mask, float("-inf"))


def hf_generate(model, prompts: list[list[int]], max_new_tokens: int, **sampling) -> list[list[int]]:
    """Static batch (left-padded) generate; returns each row's tokens up to end-of-speech."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    from transformers import LogitsProcessorList

    processor = AudioSlotLogitsProcessor(width, model.config.vocab_size)
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            eos_token_id=END_OF_SPEECH,
            pad_token_id=END_OF_SPEECH,
            logits_processor=LogitsProcessorList([processor]),
            **sampling,
        )
    rows = []
    for row in out[:, width:].tolist():
        rows.append(row[: row.index(END_OF_SPEECH)] if END_OF_SPEECH in row else row)
    return rows


def snac_windows(snac_model, tokens: list[int], seed: int, edges: bool = True) -> list[torch.Tensor]:
    """Audio of each 28-token window every 7 tokens, keeping samples 2048:4096, noise seeded per window.

    ``edges=False`` is the Orpheus reference decoder exactly. ``edges=True`` (what our graph
    streams) also keeps the first window's first frame and the last window's last two frames
    (one more chunk, same noise, when tokens after the last whole frame sent it early); a
    stream shorter than a window is decoded whole. The chunks are the ones our graph streams.
    """

    def decode(window: list[int], index: int) -> torch.Tensor:
        codes = tokens_to_snac_codes(torch.tensor(window))
        torch.manual_seed(window_noise_seed(seed, index))
        with torch.no_grad():
            return snac_model.decode([c.unsqueeze(0) for c in codes])[0, 0]

    ends = list(range(WINDOW_TOKENS, len(tokens) + 1, STRIDE_TOKENS))
    chunks = []
    for index, end in enumerate(ends):
        start = 0 if edges and index == 0 else 2048
        stop = None if edges and end == len(tokens) else 4096  # the last window, held to the close: all its tail
        chunks.append(decode(tokens[end - WINDOW_TOKENS : end], index)[start:stop])
    if edges and ends and ends[-1] < len(tokens):
        chunks.append(decode(tokens[ends[-1] - WINDOW_TOKENS : ends[-1]], len(ends) - 1)[4096:])
    elif edges and not ends and len(tokens) >= STRIDE_TOKENS:
        chunks.append(decode(tokens[: len(tokens) // STRIDE_TOKENS * STRIDE_TOKENS], 0))
    return chunks


def snac_whole(snac_model, tokens: list[int]) -> torch.Tensor:
    """One decode of the whole utterance (what a non-streaming user does)."""
    usable = len(tokens) // 7 * 7
    if usable == 0:
        return torch.zeros(0)
    codes = tokens_to_snac_codes(torch.tensor(tokens[:usable]))
    device = next(snac_model.parameters()).device
    with torch.no_grad():
        return snac_model.decode([c.unsqueeze(0).to(device) for c in codes])[0, 0]
