"""The ``bagel`` AR module: the MoT LLM plus what its flow Loop needs (latent embedding, schedule, CFG).

One flow evaluation of a (request, branch): the rows ``<|vision_start|>``, N latent rows
``vae2llm(x) + time_embedder(t) + latent_pos_embed[id]``, ``<|vision_end|>`` - all at the branch
context's next rope position, attending to that context's KV and to each other - through the LLM
with the generation weights on the latent rows; ``llm2vae`` of the latent rows is the velocity.
The branches are the views' contexts (full, no text, no image); ``flow_combine`` applies the
reference's guidance to their velocities (mstar_graphs.bagel.guidance) and the engine takes the
Euler step ``x += (t_next - t) * v`` over the shifted schedule. A request's ``gen_params`` may ask for
progress: the engine then reports the latent after each step and, on preview steps, the predicted clean
latent ``x - t * v`` (rectified flow: ``x_t = (1 - t) x0 + t noise``, ``v = noise - x0``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from mstar.engine.attention.backend import AttentionContext
from mstar.engine.flow_plan import FlowEval, FlowPlan
from mstar.weights import no_random_init
from mstar_graphs.bagel.config import BagelConfig
from mstar_graphs.bagel.generation_params import GenerationParams
from mstar_graphs.bagel.guidance import timesteps
from mstar_graphs.bagel.guided_branches import branches_needed, guided_velocity, planned_branches
from mstar_graphs.bagel.latent_embed import LatentEmbedder
from mstar_graphs.bagel.latent_tokens import latent_pos_ids
from mstar_graphs.bagel.llm import GEN_ROW, BagelLLM
from mstar_graphs.bagel.tokenizer import BagelTokenizer


class BagelFlowLLM(BagelLLM):
    # compute_logits reads row ranges of lm_head's weight; the latent embedder reads its linears' dtype
    plain_linears = ("lm_head", "latent.vae2llm", "latent.time_embedder.mlp.0")

    def __init__(
        self, config: BagelConfig, markers: tuple[int, int], latent: LatentEmbedder | None = None, **factory
    ) -> None:
        super().__init__(config.llm, config.dims, **factory)
        self.markers = markers  # <|vision_start|>, <|vision_end|>
        self.latent = latent  # set after the LLM's weights load (its tensors are not ``language_model.*``)

    @classmethod
    def from_pretrained_dir(  # type: ignore[override]
        cls, path: str | Path, dtype: torch.dtype = torch.float32, progress: bool = False
    ) -> BagelFlowLLM:
        from mstar_graphs.bagel.checkpoints import check_layout, load_llm_weights

        check_layout(path)
        config = BagelConfig.from_dir(path)
        tok = BagelTokenizer.from_dir(path)
        with no_random_init():
            module = cls(config, (tok.special.vision_start, tok.special.vision_end), dtype=dtype, device="meta")
        module.to_empty(device="cpu")
        module.reset_rope("cpu")
        load_llm_weights(module, path, dtype=dtype, progress=progress)
        d = config.dims
        module.latent = LatentEmbedder.from_pretrained_dir(
            path,
            config.llm.hidden_size,
            d.max_latent_size,
            d.latent_patch_size,
            d.latent_channels,
            dtype=dtype,
            progress=progress,
        )
        return module.eval()

    # ------------------------------------------------------------ flow contract

    def flow_plan(self, inputs: Mapping[str, torch.Tensor]) -> FlowPlan:
        if "gen_params" not in inputs:
            raise ValueError("flow input 'gen_params' is missing")
        params = GenerationParams.unpack(inputs["gen_params"])
        n = params.num_tokens
        grid = self.dims.max_latent_size
        if not (1 <= params.grid_h <= grid and 1 <= params.grid_w <= grid):
            raise ValueError(f"gen_params: latent grid {params.grid_h}x{params.grid_w} is outside 1..{grid}")
        text_on, image_on = planned_branches(params)
        branches = 1 + int(text_on) + int(image_on)
        return FlowPlan(
            rows=n + 2,
            state_shape=(n, self.dims.latent_token_dim),
            timesteps=timesteps(params.guidance.steps, params.guidance.timestep_shift).float(),
            branches=branches,
            report_every=params.report_every,  # the latent after the steps (graph output latent_step)
            predict_steps=params.preview_steps(),  # x0 predictions, decoded by the preview decoder
        )

    def flow_branches(self, inputs: Mapping[str, torch.Tensor], step: int, t: float) -> list[bool]:
        params = GenerationParams.unpack(inputs["gen_params"])
        text, image = branches_needed(params, t)
        plan_text, plan_image = planned_branches(params)
        return [True] + ([text] if plan_text else []) + ([image] if plan_image else [])

    def flow_velocity(
        self,
        x: torch.Tensor | list[torch.Tensor],
        t: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionContext,
        evals: list[FlowEval],
    ) -> torch.Tensor | list[torch.Tensor]:
        """x [B, N, p*p*C] (or a list of [N_b, p*p*C] when sizes differ), t [B], positions [sum rows]."""
        states = list(x)
        start, end = self.markers
        emb = self.model.embed_tokens.weight
        rows, kinds, rope, offsets = [], [], [], []
        cursor = 0
        for b, (state, ev) in enumerate(zip(states, evals)):
            params = GenerationParams.unpack(ev.inputs["gen_params"])
            side = 8 * self.dims.latent_patch_size
            ids = latent_pos_ids(params.grid_h * side, params.grid_w * side, side, self.dims.max_latent_size)
            latent = self.latent(state.to(self.dtype), t[b].to(self.dtype).reshape(1), ids)
            n = latent.shape[0]
            rows += [emb[start][None], latent, emb[end][None]]
            kinds.append(torch.tensor([0, *([GEN_ROW] * n), 0]))
            rope.append(positions[cursor].repeat(n + 2))  # the whole span at the context's next position
            offsets.append((cursor + 1, n))
            cursor += n + 2
        if cursor != positions.shape[0]:
            raise ValueError(f"flow rows {cursor} != positions {positions.shape[0]}")
        h = torch.cat(rows)
        ids = torch.zeros(cursor, dtype=torch.long, device=h.device)
        mask = torch.ones(cursor, dtype=torch.bool, device=h.device)
        hidden = self.forward(
            ids,
            positions,
            attn,
            embeds=h,
            embed_mask=mask,
            rope_positions=torch.cat(rope)[None].to(h.device),
            row_kinds=torch.cat(kinds).to(h.device),
        )
        out = [self.velocity_head(hidden[o : o + n]).float() for o, n in offsets]
        if isinstance(x, torch.Tensor):
            return torch.stack(out)
        return out

    def flow_combine(
        self, velocities: list[torch.Tensor | None], inputs: Mapping[str, torch.Tensor], step: int, t: float
    ) -> torch.Tensor:
        params = GenerationParams.unpack(inputs["gen_params"])
        text_on, image_on = planned_branches(params)
        v_text = velocities[1] if text_on else None
        v_image = velocities[1 + int(text_on)] if image_on else None
        return guided_velocity(params, velocities[0], v_text, v_image, t)
