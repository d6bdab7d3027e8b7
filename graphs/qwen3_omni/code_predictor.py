"""The Talker's code predictor: the 15 residual codebooks of a frame, after the Talker's first.

A small dense Qwen3 decoder (q/k RMSNorm, 1-D RoPE). Per frame, as the reference runs it (a fresh
cache every frame): the prefill is ``[talker hidden, talker codec embedding of code 0]`` at
positions 0 and 1; ``lm_head[0]`` gives code 1; each next code g enters as
``codec_embedding[g-2](code g-1)`` and ``lm_head[g-1]`` gives code g. Greedy, or, when the Talker
samples, top-k 50 then top-p 0.8 at temperature 1 (the reference's settings for it).

Here every frame of a step (all sequences of the batch) runs at once: B rows, 15 small steps over a
dense per-call cache of at most 16 positions, so nothing is paged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mstar_graphs.qwen3_omni.config import TextConfig
from mstar_graphs.qwen3_omni.decoder import DecoderStack, rope_cos_sin

TOP_K, TOP_P = 50, 0.8


class DenseCausalCache:
    """K/V of B equal-length sequences, appended per call; attention is causal within each new block."""

    def __init__(self, batch: int) -> None:
        self.batch = batch
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """q [B*T, Hq, D]; k, v [B*T, Hkv, D] (row-major over B) -> [B*T, Hq, D]."""
        b = self.batch
        t = q.shape[0] // b
        q, k, v = (x.reshape(b, t, x.shape[1], x.shape[2]).transpose(1, 2) for x in (q, k, v))
        if layer in self.k:
            k, v = torch.cat([self.k[layer], k], dim=2), torch.cat([self.v[layer], v], dim=2)
        self.k[layer], self.v[layer] = k, v
        past = k.shape[2] - t
        # one new position sees every key; a first block is plainly causal: no mask to build (15 steps a frame)
        mask = (
            None
            if t == 1 or past == 0
            else torch.ones(t, k.shape[2], dtype=torch.bool, device=q.device).tril(diagonal=past)
        )
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=past == 0 and t > 1, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
        )
        return out.transpose(1, 2).reshape(b * t, q.shape[1], q.shape[3])


def sample_top_k_top_p(logits: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """logits [B, V] fp32 -> codes [B]: top-k 50, then nucleus 0.8, one draw per row with its generator."""
    k = min(TOP_K, logits.shape[-1])
    values, ids = logits.topk(k, dim=-1)  # sorted descending
    probs = torch.softmax(values, dim=-1)
    # keep the smallest prefix whose mass reaches top_p (the token that crosses it stays)
    cumulative = probs.cumsum(-1)
    drop = (cumulative - probs) > TOP_P
    probs = probs.masked_fill(drop, 0.0)
    probs = (probs / probs.sum(-1, keepdim=True)).cpu()  # drawn on the CPU, where the generators live
    picks = torch.stack([torch.multinomial(p, 1, generator=g) for p, g in zip(probs, generators)]).to(ids.device)
    return ids.gather(1, picks).reshape(-1)


class CodePredictor(nn.Module):
    """Checkpoint names under ``talker.code_predictor.``: ``model.codec_embedding.G``, ``model.layers``,
    ``model.norm``, ``lm_head.G`` (G = 0 .. num_code_groups - 2)."""

    def __init__(self, cfg: TextConfig, groups: int, **factory) -> None:
        super().__init__()
        self.cfg, self.groups = cfg, groups
        self.model = DecoderStack(cfg, lambda _: False, **factory)
        self.model.codec_embedding = nn.ModuleList(
            nn.Embedding(cfg.vocab_size, cfg.hidden_size, **factory) for _ in range(groups - 1)
        )
        self.lm_head = nn.ModuleList(
            nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, **factory) for _ in range(groups - 1)
        )
        self._rope: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # (dtype, device) -> cos, sin [groups+1, D/2]

    def _rope_rows(self, start: int, t: int, b: int, dtype: torch.dtype, device: torch.device):
        """cos, sin of positions start.. for b rows: one table per dtype and device, made once (a frame's 15
        steps each rebuilt it: ~10 small ops a step), equal to computing them per step."""
        table = self._rope.get((dtype, device))
        if table is None:
            table = rope_cos_sin(
                torch.arange(self.groups + 1, device=device), self.cfg.dim_per_head, self.cfg.theta, dtype
            )
            self._rope[(dtype, device)] = table
        cos, sin = table
        return cos[start : start + t].repeat(b, 1), sin[start : start + t].repeat(b, 1)

    def _run(self, x: torch.Tensor, start: int, cache: DenseCausalCache) -> torch.Tensor:
        """x [B, T, H] at positions start.. -> final-normed hidden of the last position [B, H]."""
        b, t, h = x.shape
        cos, sin = self._rope_rows(start, t, b, x.dtype, x.device)
        out, _ = self.model.run(x.reshape(b * t, h), cos, sin, cache)
        return out.reshape(b, t, h)[:, -1]

    def predict(
        self,
        talker_hidden: torch.Tensor,
        code0_embed: torch.Tensor,
        sample: list[bool],
        generators: list[torch.Generator | None],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """talker_hidden, code0_embed [B, H] -> (codes [B, groups - 1], the frame's codec embeddings
        [B, groups, H]: ``code0_embed`` then each residual code's; the Talker's next input is their sum)."""
        b = talker_hidden.shape[0]
        cache = DenseCausalCache(b)
        h = self._run(torch.stack([talker_hidden, code0_embed], dim=1), 0, cache)
        codes, embeds = [], [code0_embed]
        for g in range(self.groups - 1):
            logits = self.lm_head[g](h).float()
            code = logits.argmax(-1)
            if any(sample):
                drawn = sample_top_k_top_p(logits, generators)
                code = torch.where(torch.tensor(sample, device=code.device), drawn, code)
            codes.append(code)
            e = self.model.codec_embedding[g](code)
            embeds.append(e)
            if g < self.groups - 2:
                h = self._run(e[:, None], g + 2, cache)
        return torch.stack(codes, dim=1), torch.stack(embeds, dim=1)
