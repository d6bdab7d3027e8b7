"""Frame Loop state (a session's frame context, one call's rollouts over it) and the checks of their inputs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from mstar.engine.block_manager import BlockTable
from mstar.engine.sequence import ActiveCall

Frame = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (latent, action, state) of one computed frame


@dataclass
class FrameContext:
    """A session's (or request's) frames: computed ones in ``table``, the newest pending."""

    owner: str
    node: str
    request_id: str
    table: BlockTable = field(default_factory=BlockTable)
    computed: list[Frame] = field(default_factory=list)  # inputs kept for an exact re-prefill
    pending: tuple[torch.Tensor, torch.Tensor] | None = None  # (latent, state)
    call: ActiveCall | None = None
    todo: list[Frame] = field(default_factory=list)  # frames this call computes
    next_pending: tuple[torch.Tensor, torch.Tensor] | None = None
    rebuild: bool = False  # recompute ``todo`` from position 0
    window: int = 0
    slides: int = 0
    arrival: float = field(default_factory=time.monotonic)

    @property
    def num_frames(self) -> int:
        return len(self.computed)


@dataclass
class Rollout:
    """One call's S rollouts of H frames over a context."""

    owner: str
    node: str
    request_id: str
    call: ActiveCall
    actions: torch.Tensor  # [S, H, A]
    frame: torch.Tensor | None  # [S, *latent]: the next frame to compute (None: the pending one)
    state: torch.Tensor | None  # [S, S_dim]
    context_key: tuple[str, str] | None  # the context view it forks
    all_frames: bool = False
    tables: list[BlockTable] = field(default_factory=list)
    base: int = 0  # context frames shared by every sample
    step: int = 0
    started: bool = False
    outputs: list[torch.Tensor] = field(default_factory=list)
    arrival: float = field(default_factory=time.monotonic)

    @property
    def samples(self) -> int:
        return int(self.actions.shape[0])

    @property
    def horizon(self) -> int:
        return int(self.actions.shape[1])


def shape_error(node: str, name: str, got: torch.Tensor, want: str) -> ValueError:
    return ValueError(f"node {node!r}: input {name!r} has shape {tuple(got.shape)}, expected {want}")


def finite_input(node: str, name: str, t: torch.Tensor) -> torch.Tensor:
    t = t.float()
    if not torch.isfinite(t).all():
        raise ValueError(f"node {node!r}: input {name!r} has NaN or infinite values")
    return t
