"""The V-JEPA 2-AC action-conditioned predictor as a frame module of the AR engine.

Per frame t the rows are ``[action_t, state_t, patch_0 .. patch_{P-1}]`` (Meta's
``VisionTransformerPredictorAC``: ``action_encoder`` / ``state_encoder`` Linear 7 -> width,
``predictor_embed`` Linear encoder width -> width). Attention is block-causal over frames. RoPE:
patches at (t, row, col); the action and state tokens rotate only their frame block, at t (the
same as position (t, 0, 0)). The output at frame t's patches - condition rows dropped,
``predictor_norm``, ``predictor_proj`` back to the encoder width, then a LayerNorm without affine
(the wrapper's ``normalize_reps``) - is the prediction of frame t + 1.

Two ways to run the same weights: ``forward_frames`` through the engine's paged KV (a frame is
computed once, then attended to from the cache), and ``native_forward``, Meta's way, the whole
context at once with its block-causal mask (what a native rollout re-runs every step).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mstar.engine.attention.backend import AttentionContext
from mstar.engine.frame_module import FrameModule
from mstar.engine.kv_cache import KVSpec
from mstar_graphs.vjepa2.config import VJepa2Config
from mstar_graphs.vjepa2.encoder import REPS_EPS
from mstar_graphs.vjepa2.pose import next_pose
from mstar_graphs.vjepa2.rope import patch_grid_positions, rope_tables
from mstar_graphs.vjepa2.vit import Attend, Block, dense_attend

COND_TOKENS = 2  # action, state (the released model uses no extrinsics token)


def block_causal_mask(frames: int, frame_tokens: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[F * ft, F * ft] bool, True where a row may attend: key frame <= query frame."""
    f = torch.arange(frames * frame_tokens, device=device) // frame_tokens
    return f[None, :] <= f[:, None]


class VJepa2Predictor(FrameModule):
    def __init__(self, config: VJepa2Config, **factory) -> None:
        super().__init__()
        self.config = config.validated()
        p, e = config.predictor, config.encoder
        self.predictor_embed = nn.Linear(e.width, p.width, **factory)
        self.action_encoder = nn.Linear(p.action_dim, p.width, **factory)
        self.state_encoder = nn.Linear(p.action_dim, p.width, **factory)
        # unused without extrinsics, but in every released checkpoint (loaded strictly)
        self.extrinsics_encoder = nn.Linear(p.action_dim - 1, p.width, **factory)
        hidden = int(p.width * p.mlp_ratio)
        self.predictor_blocks = nn.ModuleList(Block(p.width, p.heads, hidden, p.eps, **factory) for _ in range(p.depth))
        self.predictor_norm = nn.LayerNorm(p.width, eps=p.eps, **factory)
        self.predictor_proj = nn.Linear(p.width, e.width, **factory)

    # -- FrameModule / ARModule API ----------------------------------------------------------
    def kv_spec(self) -> KVSpec:
        p = self.config.predictor
        return KVSpec(num_layers=p.depth, num_kv_heads=p.heads, head_dim=p.width // p.heads)

    @property
    def frame_tokens(self) -> int:
        return self.config.frame_tokens

    @property
    def latent_shape(self) -> tuple[int, int]:
        return (self.config.encoder.num_patches, self.config.encoder.width)

    @property
    def action_dim(self) -> int:
        return self.config.predictor.action_dim

    @property
    def state_dim(self) -> int:
        return self.config.predictor.action_dim

    @property
    def max_frames(self) -> int:
        return self.config.max_frames

    @property
    def dtype(self) -> torch.dtype:
        return self.predictor_norm.weight.dtype

    def advance_state(self, states: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return next_pose(states, actions)

    # -- computation -------------------------------------------------------------------------
    def _rows(self, latents: torch.Tensor, actions: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """[N, P, D_enc], [N, 7], [N, 7] -> [N * frame_tokens, width] embedded rows, frame-major."""
        n = latents.shape[0]
        x = self.predictor_embed(latents)
        a = self.action_encoder(actions)[:, None]
        s = self.state_encoder(states)[:, None]
        return torch.cat([a, s, x], dim=1).reshape(n * self.frame_tokens, -1)

    def _rope(self, frame_positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [N * frame_tokens, head_dim] for frames at absolute positions [N]."""
        p = self.config.predictor
        grid = self.config.encoder.grid
        h, w = patch_grid_positions(grid, frame_positions.device)
        zeros = torch.zeros(COND_TOKENS, dtype=h.dtype, device=h.device)
        height, width = torch.cat([zeros, h]), torch.cat([zeros, w])
        n, ft = frame_positions.shape[0], self.frame_tokens
        depth = frame_positions.repeat_interleave(ft)
        return rope_tables(p.width // p.heads, depth, height.repeat(n), width.repeat(n))

    def _predict(self, rows: torch.Tensor, n: int) -> torch.Tensor:
        x = rows.view(n, self.frame_tokens, -1)[:, COND_TOKENS:]
        x = self.predictor_proj(self.predictor_norm(x))
        if self.config.normalize_reps:
            x = F.layer_norm(x, (x.shape[-1],), eps=REPS_EPS)
        return x

    def _run(self, rows: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        for i, block in enumerate(self.predictor_blocks):
            rows = block(rows, cos, sin, attend, i)
        return rows

    def forward_frames(
        self,
        latents: torch.Tensor,
        actions: torch.Tensor,
        states: torch.Tensor,
        frame_positions: torch.Tensor,
        attn: AttentionContext,
    ) -> torch.Tensor:
        n = latents.shape[0]
        cos, sin = self._rope(frame_positions)
        rows = self._run(self._rows(latents, actions, states), cos, sin, attn)
        return self._predict(rows, n)

    def native_forward(self, latents: torch.Tensor, actions: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """Meta's forward over whole contexts: [B, T, P, D], [B, T, 7], [B, T, 7] -> predictions
        [B, T, P, D] (frame t's is the prediction of frame t + 1), frames at positions 0 .. T-1.
        Inputs are cast to the module's dtype, as the engine casts them."""
        b, t = latents.shape[:2]
        latents, actions, states = (x.to(self.dtype) for x in (latents, actions, states))
        rows = self._rows(latents.flatten(0, 1), actions.flatten(0, 1), states.flatten(0, 1))
        cos, sin = self._rope(torch.arange(t, device=latents.device))
        cos, sin = cos.repeat(b, 1), sin.repeat(b, 1)
        mask = block_causal_mask(t, self.frame_tokens, latents.device)
        rows = self._run(rows, cos, sin, dense_attend(b, mask))
        return self._predict(rows, b * t).view(b, t, *self.latent_shape)

    def forward(self, *args, **kwargs):  # type: ignore[override]
        raise TypeError("VJepa2Predictor runs through forward_frames (the engine) or native_forward")
