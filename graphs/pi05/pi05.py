"""pi0.5's prefix LM + action expert as one AR module: the prefix fills the paged KV once,
each flow step's expert rows attend to it through the same ``attn``.

Engine contract (see ``mstar.engine.ar_module`` and ``mstar.engine.flow_loop``):

- ``forward(input_ids, positions, attn, embeds=None, embed_mask=None)``: the prefix
  LM over packed rows (the engine sets the prefix-bidirectional mask); rows where
  ``embed_mask`` is True take ``embeds`` (image embeddings) instead of the token's.
- ``flow_velocity(x [B, H, A], time [B], positions [B*H], attn) -> v [B, H, A]``:
  one evaluation of the expert; rows are sequence-major, each sequence's H rows see
  its prefix and each other. Their K/V go through ``attn`` like any row's, into the
  slots the engine reserved after the prefix (overwritten every step).
- Flow convention (openpi): x at t = 1 is noise; ``euler_step`` with dt = -1/steps
  down to t = 0.
"""

from __future__ import annotations

from pathlib import Path

import torch

from mstar.engine.ar_module import ARModule
from mstar.engine.attention.backend import AttentionContext
from mstar.engine.kv_cache import KVSpec
from mstar.layers.tensor_parallel import restricted_logits
from mstar.weights import no_random_init
from mstar_graphs.common.rope import register_rope_tables, rope_inv_freq, rope_tables, rotation_tables
from mstar_graphs.pi05.config import Pi05Config
from mstar_graphs.pi05.expert import ActionExpert
from mstar_graphs.pi05.gemma import GemmaPrefixLM


def flow_times(steps: int) -> list[float]:
    """The times the velocity is evaluated at: 1, 1 - 1/steps, ..., 1/steps."""
    if steps <= 0:
        raise ValueError(f"steps must be > 0, got {steps}")
    return [1.0 - k / steps for k in range(steps)]


def euler_step(x: torch.Tensor, v: torch.Tensor, dt: float) -> torch.Tensor:
    """One Euler step of the flow: x + dt * v (dt = -1/steps: from noise toward actions)."""
    return x + dt * v.to(x.dtype)


class Pi05Model(ARModule):
    """``llm``: PaliGemma's Gemma prefix LM; ``expert``: the action expert (+ its projections).

    The SigLIP tower is a separate stateless node (:class:`Pi05ImageEncoder`); its output
    rows enter ``forward`` as ``embeds``.
    """

    accepts_need_hidden = True  # the engine may ask for the KV only (see forward)

    def __init__(
        self, config: Pi05Config, *, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
    ) -> None:
        super().__init__()
        self.config = config.validated()
        factory = {"dtype": dtype, "device": device}
        self.llm = GemmaPrefixLM(config, **factory)
        self.expert = ActionExpert(config, **factory)
        self._reset_rope(device)

    def _reset_rope(self, device: torch.device | str | None) -> None:
        c = self.config
        cos, sin = rope_tables(rope_inv_freq(c.prefix.head_dim, c.rope_theta), c.max_positions)
        register_rope_tables(self, cos, sin, self.llm.norm.weight.dtype, device)

    @classmethod
    def from_pretrained_dir(
        cls, path: str | Path, dtype: torch.dtype = torch.float32, progress: bool = True
    ) -> Pi05Model:
        """Config + prefix LM + expert weights from a pi0.5 checkpoint directory, on CPU in ``dtype``."""
        from mstar_graphs.pi05.checkpoints import load_part  # checkpoints imports this module

        with no_random_init():
            module = cls(Pi05Config.from_dir(path), dtype=dtype, device="meta")
        module.to_empty(device="cpu")
        module._reset_rope("cpu")
        load_part(module, path, "model", dtype=dtype, progress=progress)
        return module.eval()

    # ----------------------------------------------------------- ARModule API

    def kv_spec(self) -> KVSpec:
        p = self.config.prefix  # the expert's depth, kv heads and head_dim are the same (validated)
        return KVSpec(num_layers=p.depth, num_kv_heads=p.num_kv_heads, head_dim=p.head_dim)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def max_positions(self) -> int:
        return self.config.max_positions

    @property
    def action_horizon(self) -> int:
        return self.config.action_horizon

    @property
    def action_dim(self) -> int:
        return self.config.action_dim

    @property
    def num_steps(self) -> int:
        return self.config.num_steps

    @property
    def tokens_per_image(self) -> int:
        return self.config.vision.num_patches

    @property
    def dtype(self) -> torch.dtype:
        return self.llm.norm.weight.dtype

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # No bounds check here (it would sync the device every step): the engine keeps
        # positions below max_positions, and index_select fails loudly past the tables.
        # full-width tables, built once per forward: each layer's rotation then takes fewer ops
        return rotation_tables(self.rope_cos.index_select(0, positions), self.rope_sin.index_select(0, positions))

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,  # type: ignore[override]
        attn: AttentionContext,
        embeds: torch.Tensor | None = None,
        embed_mask: torch.Tensor | None = None,
        need_hidden: bool = True,
    ) -> torch.Tensor:
        """input_ids, positions [T] int64; embeds [T or marked, width], embed_mask [T] bool
        -> final-normed hidden [T, prefix_width]; with ``need_hidden=False`` (the engine samples
        nothing from this step: a pi0.5 prefix) only the KV is computed and the result is unused."""
        if input_ids.dim() != 1 or positions.shape != input_ids.shape:
            raise ValueError(
                f"input_ids and positions must both be [T]; got {tuple(input_ids.shape)} and {tuple(positions.shape)}"
            )
        cos, sin = self._rope(positions)
        return self.llm(self.llm.embed(input_ids, embeds, embed_mask), cos, sin, attn, kv_only=not need_hidden)

    def flow_velocity(
        self, x: torch.Tensor, time: torch.Tensor, positions: torch.Tensor, attn: AttentionContext
    ) -> torch.Tensor:
        """x [B, H, A], time [B], positions [B*H] (sequence-major) -> velocity [B, H, A] fp32."""
        if x.dim() != 3 or positions.shape != (x.shape[0] * x.shape[1],):
            raise ValueError(
                f"flow_velocity needs x [B, H, A] and positions [B*H]; got {tuple(x.shape)} "
                f"and {tuple(positions.shape)}"
            )
        cos, sin = self._rope(positions)
        return self.expert(x, time, cos, sin, attn)

    def compute_logits(self, hidden: torch.Tensor, token_ids: torch.Tensor | None = None) -> torch.Tensor:
        """PaliGemma's LM head is tied to the token embeddings."""
        return restricted_logits(hidden, self.llm.embed_tokens.weight, token_ids)
