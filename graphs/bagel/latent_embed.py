"""BAGEL's latent-token embedding: VAE latent tokens at flow time t -> LLM input rows.

As ``Bagel._forward_flow`` (noisy tokens of the image being generated) and
``forward_cache_update_vae`` (a clean context image, t = 0) compute it:

    rows = vae2llm(tokens) + time_embedder(t) + latent_pos_embed[ids]

- ``vae2llm``: Linear p*p*C -> Hd (64 -> 3584 in the release);
- ``time_embedder`` (``modeling_utils.TimestepEmbedder``): 256 frequencies of t, cos first then
  sin, t as is (no x1000), then ``mlp`` = Linear(256, Hd), SiLU, Linear(Hd, Hd);
- ``latent_pos_embed.pos_embed``: the frozen 2-D sin-cos table [grid**2, Hd] (grid = 64).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from mstar_graphs.bagel.ema_parts import build_empty, load_ema_part
from mstar_graphs.bagel.sincos import SinCosPositionTable, timestep_frequencies

LATENT_PREFIXES = ("vae2llm.", "time_embedder.", "latent_pos_embed.")
FREQUENCY_DIM = 256


class TimestepEmbedder(nn.Module):
    """t [N] -> [N, hidden]: ``mlp(frequencies(t))`` with ``mlp.0`` / ``mlp.2`` the Linears."""

    def __init__(self, hidden: int, frequency_dim: int = FREQUENCY_DIM, **factory: object) -> None:
        super().__init__()
        self.frequency_dim = frequency_dim
        self.mlp = nn.Sequential(
            nn.Linear(frequency_dim, hidden, **factory), nn.SiLU(), nn.Linear(hidden, hidden, **factory)
        )

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        freqs = timestep_frequencies(t, self.frequency_dim)
        return self.mlp(freqs.to(self.mlp[0].weight.dtype))


class LatentEmbedder(nn.Module):
    """Latent tokens [N, p*p*C] at time t, positions ids -> LLM rows [N, llm_hidden]."""

    def __init__(
        self,
        llm_hidden: int,
        grid: int,
        patch: int,
        channels: int,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if llm_hidden <= 0 or llm_hidden % 4:
            raise ValueError(f"llm_hidden must be a positive multiple of 4 (2-D sin-cos table), got {llm_hidden}")
        factory = {"dtype": dtype, "device": device}
        self.token_dim = patch * patch * channels
        self.vae2llm = nn.Linear(self.token_dim, llm_hidden, **factory)
        self.time_embedder = TimestepEmbedder(llm_hidden, **factory)
        self.latent_pos_embed = SinCosPositionTable(grid, llm_hidden, **factory)

    @classmethod
    def from_pretrained_dir(
        cls,
        path: str | Path,
        llm_hidden: int,
        grid: int,
        patch: int,
        channels: int,
        *,
        dtype: torch.dtype = torch.float32,
        progress: bool = False,
    ) -> LatentEmbedder:
        """Load ``vae2llm.*``, ``time_embedder.*``, ``latent_pos_embed.*`` from ``<path>/ema.safetensors``."""
        module = build_empty(lambda device: cls(llm_hidden, grid, patch, channels, device=device))
        load_ema_part(module, path, LATENT_PREFIXES, dtype=dtype, progress=progress)
        return module.eval()

    def forward(self, tokens: torch.Tensor, t: float | torch.Tensor, pos_ids: torch.Tensor) -> torch.Tensor:
        """tokens [N, p*p*C]; t a float, or [1] / [N] tensor of times in [0, 1]; pos_ids [N] -> [N, llm_hidden]."""
        if tokens.dim() != 2 or tokens.shape[1] != self.token_dim:
            raise ValueError(f"latent tokens must be [N, {self.token_dim}], got {tuple(tokens.shape)}")
        n = tokens.shape[0]
        if pos_ids.shape != (n,):
            raise ValueError(f"pos_ids must be [{n}] (one per token), got {tuple(pos_ids.shape)}")
        weight = self.vae2llm.weight
        times = torch.as_tensor(t, dtype=torch.float32, device=weight.device).reshape(-1)
        if times.shape[0] not in (1, n):
            raise ValueError(f"t must be a float or hold 1 or {n} times, got {times.shape[0]}")
        # one time for every token (the usual case): embed it once, broadcast over the rows
        return self.vae2llm(tokens.to(weight.dtype)) + self.time_embedder(times) + self.latent_pos_embed(pos_ids)
