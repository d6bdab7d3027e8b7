"""The contract between the AR engine's frame Loops and a world-model predictor.

A frame module's rows come in frames of ``frame_tokens`` rows (conditioning tokens, then
the frame's latent patches) and attend block-causally: a frame sees itself and every
earlier frame, so a computed frame's K/V never change when later frames are appended
and a rollout can keep them (see ``mstar.engine.frame_loop``).
"""

from __future__ import annotations

import torch

from mstar.engine.ar_module import ARModule
from mstar.engine.attention.backend import AttentionContext


class FrameModule(ARModule):
    """An AR module over frames. The engine owns the KV (one block per frame), batching and
    the rollout Loop; the module embeds frames, runs its layers and predicts."""

    @property
    def frame_tokens(self) -> int:
        """Rows per frame (conditioning tokens + latent patches)."""
        raise NotImplementedError

    @property
    def latent_shape(self) -> tuple[int, ...]:
        """Shape of one frame's latent (e.g. [patches, width])."""
        raise NotImplementedError

    @property
    def action_dim(self) -> int:
        raise NotImplementedError

    @property
    def state_dim(self) -> int:
        raise NotImplementedError

    @property
    def max_frames(self) -> int:
        """Frames one context may hold (positions are absolute frame indices below this)."""
        raise NotImplementedError

    @property
    def max_positions(self) -> int:
        return self.max_frames * self.frame_tokens

    @property
    def vocab_size(self) -> int:
        return 1  # no tokens: every row is an embedding

    def forward_frames(
        self,
        latents: torch.Tensor,
        actions: torch.Tensor,
        states: torch.Tensor,
        frame_positions: torch.Tensor,
        attn: AttentionContext,
    ) -> torch.Tensor:
        """latents [N, *latent_shape], actions [N, A], states [N, S], frame_positions [N] int64
        (absolute frame index of each) -> the next-frame prediction made at each frame,
        [N, *latent_shape]. Frames are packed sequence by sequence, oldest first; frame ``i``
        is rows ``[i * frame_tokens, (i + 1) * frame_tokens)`` of what ``attn`` sees."""
        raise NotImplementedError

    def advance_state(self, states: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """The state after taking ``actions`` [N, A] in ``states`` [N, S] (a rollout's next frame)."""
        raise NotImplementedError
