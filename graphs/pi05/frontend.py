"""pi0.5 as a servable policy: its graph, its two submodules, its tokenizer and observation -> Request.

``Pi05Policy.load`` first inspects the checkpoint (``checkpoint_layout``: config, weights
index, normalisation statistics, tokenizer) and only then reads weights, so a missing
file fails in a moment, naming the paths tried. The policy knows the checkpoint's cameras,
state and action dims and its normalisation; a robot front-end normalises the raw state
with ``normalization(...)``, builds the request, and unnormalises the chunk it gets.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mstar.conductor import Request
from mstar.engine.attention.metadata import MaskKind
from mstar.engine.device_loop import run_on_device
from mstar.priority import Priority
from mstar.sampling_params import SamplingParams
from mstar.weights import no_random_init
from mstar_graphs.pi05.checkpoint_layout import CheckpointLayout, inspect_checkpoint
from mstar_graphs.pi05.checkpoints import resolve_path
from mstar_graphs.pi05.graph import pi05_graph
from mstar_graphs.pi05.normalization import Normalization, joint_limits
from mstar_graphs.pi05.pi05 import Pi05Model
from mstar_graphs.pi05.prompt import PromptEncoder, TaskPrompt, prefix_tensors
from mstar_graphs.pi05.siglip import Pi05ImageEncoder
from mstar_graphs.pi05.tokenizer import load_tokenizer

log = logging.getLogger("mstar_graphs.pi05")


@dataclass
class Pi05Policy:
    path: Path
    model: Pi05Model
    encoder: Pi05ImageEncoder
    tokenizer: Any
    layout: CheckpointLayout
    prompts: PromptEncoder
    _ids: Any = field(default_factory=itertools.count)

    @classmethod
    def load(
        cls,
        weights: str | Path | None = None,
        *,
        preset: str = "tiny",
        tokenizer: str | Path | None = None,
        asset_id: str | None = None,
        progress: bool = True,
        load_weights: bool = True,
    ) -> Pi05Policy:
        """Real weights from ``weights`` (a LeRobot or openpi pi0.5 PyTorch checkpoint dir), else the
        generated tiny one. ``tokenizer``: a tokenizer file or directory (default: looked for in the
        checkpoint, then openpi's cache); ``asset_id``: which of an openpi checkpoint's statistics.
        ``load_weights=False``: everything but the weights (the modules stay on the meta device), for
        a process that builds requests while Worker processes hold the model."""
        path = resolve_path(weights, preset)
        layout = inspect_checkpoint(path, tokenizer=tokenizer, asset_id=asset_id)  # before any weight is read
        text = load_tokenizer(layout.tokenizer_file)
        config = layout.config
        if text.vocab_size() > config.vocab_size:
            raise ValueError(
                f"{layout.tokenizer_file}: {text.vocab_size()} tokens, more than the model's vocabulary "
                f"({config.vocab_size}): not this checkpoint's tokenizer"
            )
        prompts = PromptEncoder(
            text, bos_id=config.bos_token_id, max_len=config.max_token_len, state_in_prompt=config.discrete_state_input
        )
        if not load_weights:
            with no_random_init():
                model, encoder = Pi05Model(config, device="meta"), Pi05ImageEncoder(config, device="meta")
            return cls(path, model, encoder, text, layout, prompts)
        # on the engines' thread: one thread runs parallel torch work (see mstar.engine.device_loop)
        model = run_on_device(Pi05Model.from_pretrained_dir, path, progress=progress)
        encoder = run_on_device(Pi05ImageEncoder.from_pretrained_dir, path, progress=progress)
        return cls(path, model, encoder, text, layout, prompts)

    def with_modules(self, model: Pi05Model, encoder: Pi05ImageEncoder) -> Pi05Policy:
        """The same policy on other copies of its modules (another dtype, another device)."""
        return dataclasses.replace(self, model=model, encoder=encoder, _ids=itertools.count())

    @property
    def random_weights(self) -> bool:
        return self.model.config.random_weights

    @property
    def action_horizon(self) -> int:
        return self.model.action_horizon

    @property
    def action_dim(self) -> int:
        """The dims the model computes (32 for the released models; a request's chunk is [H, action_dim])."""
        return self.model.action_dim

    @property
    def robot_action_dim(self) -> int | None:
        """The dims a robot gets: the first ``robot_action_dim`` of each action (the checkpoint's
        ``output_features``, or its action statistics); None when the checkpoint does not say (then
        the robot's joint count does)."""
        return self.layout.action_dim

    @property
    def cameras(self) -> tuple[str, ...]:
        return self.layout.cameras

    def normalization(
        self, joint_lower: list[float] | None = None, joint_upper: list[float] | None = None
    ) -> Normalization:
        """The checkpoint's own statistics; without any, the joint limits given (else ValueError)."""
        if self.layout.normalization is not None:
            return self.layout.normalization
        if not joint_lower or not joint_upper:
            raise ValueError(
                f"{self.path}: the checkpoint has no normalisation statistics: give joint_lower and "
                "joint_upper to scale the state and actions by"
            )
        return joint_limits(list(joint_lower), list(joint_upper))

    def graph(self):
        return pi05_graph(self.model.num_steps)

    def modules(self) -> dict[str, torch.nn.Module]:
        return {"pi05": self.model, "vision": self.encoder}

    def task(self, text: str, *, max_tokens: int | None = None) -> TaskPrompt:
        """A prompt, tokenized once (PromptError when empty or over ``max_tokens``)."""
        return self.prompts.task(text, max_tokens=max_tokens)

    def request(
        self,
        images: torch.Tensor,
        state: torch.Tensor,
        prompt: str | TaskPrompt,
        *,
        seed: int | None = None,
        noise: torch.Tensor | None = None,
        guide: torch.Tensor | None = None,
        guide_weights: torch.Tensor | None = None,
        request_id: str | None = None,
        session_id: str | None = None,
        priority: Priority | str = Priority.CONTROL,
    ) -> Request:
        """One observation -> a Request whose output ``actions`` is an [H, model action dims] chunk,
        still normalised (take ``[:, :robot_action_dim]`` and unnormalise it).

        ``images`` [C, H, W, 3] uint8, the checkpoint's cameras present, in its order; ``state``
        normalised (discretised into the prompt); ``prompt`` a task (or one tokenized by ``task``);
        ``guide`` [H, model action dims] + ``guide_weights`` [H]: the (normalised) actions that will
        already have run while this chunk is computed, and how firmly to keep them. ``request.meta["prompt_truncated"]``
        says the prompt was cut to the checkpoint's token budget. Bad observations (empty prompt,
        NaN state, wrong image shape) raise ValueError here."""
        if images.dim() == 3:
            images = images[None]
        if images.dim() != 4 or images.shape[-1] != 3:
            raise ValueError(f"images must be [cameras, height, width, 3], got {tuple(images.shape)}")
        task = prompt if isinstance(prompt, TaskPrompt) else self.prompts.task(prompt)
        text_ids, truncated = self.prompts.ids(task, state)
        ids, mask = prefix_tensors(text_ids, images.shape[0], self.model.tokens_per_image)
        h, a = self.action_horizon, self.model.action_dim
        if noise is None:
            gen = torch.Generator().manual_seed(seed) if seed is not None else None
            noise = torch.randn((h, a), generator=gen)
        if guide is None:
            guide, guide_weights = torch.zeros(h, a), torch.zeros(h)
        elif guide_weights is None:
            raise ValueError("guide needs guide_weights")
        inputs = {
            "images": images,
            "input_ids": ids,
            "embed_mask": mask,
            "noise": noise.float(),
            "guide": guide.float(),
            "guide_weights": guide_weights.float(),
        }
        meta = {
            "prefix.mask": int(MaskKind.PREFIX_BIDIRECTIONAL),
            "prefix.mask_arg": int(ids.numel()),
            "prompt_truncated": truncated,
        }
        rid = request_id if request_id is not None else f"pi05-{next(self._ids)}"
        return Request(
            inputs,
            SamplingParams(max_tokens=1, seed=seed),
            request_id=rid,
            session_id=session_id,
            meta=meta,
            priority=Priority.parse(priority),  # a robot's next chunk: control, unless the caller says
        )
