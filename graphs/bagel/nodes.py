"""BAGEL's stateless nodes: the two image encoders, the image rows of a context, the VAE decoder.

Calls batch when their inputs have equal shapes (images of one size); each returns one request's rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mstar.graph.node import NodeCall, NodeSubmodule
from mstar_graphs.bagel.autoencoder import FluxAutoencoder
from mstar_graphs.bagel.generation_params import GenerationParams
from mstar_graphs.bagel.latent_embed import LatentEmbedder
from mstar_graphs.bagel.latent_tokens import latent_pos_ids, patchify_latent, to_uint8_image, unpatchify_latent
from mstar_graphs.bagel.vision_encoder import BagelVisionEncoder


class VitEncoderNode(NodeSubmodule):
    """``image`` [3, H, W] in [-1, 1] (ViT-resized, H and W multiples of the patch) -> ``embeds`` [N, Hd]."""

    # linears whose .weight the encoder reads (for its dtype / device): kept plain by the engine
    plain_linears = ("encoder.connector.fc1", "encoder.vit_model.vision_model.embeddings.patch_embedding")

    def __init__(self, encoder: BagelVisionEncoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, image: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[override]
        dtype = next(self.encoder.parameters()).dtype
        rows = self.encoder([img.to(dtype) for img in image])
        return {"embeds": torch.stack(rows)}


class VaeEncoderNode(NodeSubmodule):
    """``image`` [3, H, W] in [-1, 1] (VAE-resized, multiples of 16) -> ``embeds`` [N, Hd]: the clean latent
    tokens (the Gaussian's mean: deterministic) embedded at time 0, as a context image enters the LLM."""

    plain_linears = ("embedder.vae2llm", "embedder.time_embedder.mlp.0")  # read for their dtype

    def __init__(self, vae: FluxAutoencoder, embedder: LatentEmbedder, latent_patch: int, latent_grid: int) -> None:
        super().__init__()
        self.vae = vae
        self.embedder = embedder
        self.latent_patch = latent_patch
        self.latent_grid = latent_grid

    def forward(self, image: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[override]
        dtype = next(self.vae.parameters()).dtype
        z = self.vae.encode(image.to(dtype))
        height, width = image.shape[-2:]
        ids = latent_pos_ids(height, width, 8 * self.latent_patch, self.latent_grid)
        rows = []
        for latent in z:
            tokens = patchify_latent(latent, self.latent_patch)
            rows.append(self.embedder(tokens.to(dtype), 0.0, ids))
        return {"embeds": torch.stack(rows)}


class ContextNode(NodeSubmodule):
    """The three views' prefill inputs of one request: its laid-out ids, positions, spans and row kinds
    (request inputs, passed on) and the image rows in the order its spans come - the VAE rows, then the
    ViT rows (as the reference appends an image: VAE span first) - as ``embeds`` for the full view and
    ``cfg_text_embeds`` for the no-text view, each only where that view's rows hold the image (an edit's
    full view that forks the no-text one brings only the instruction). A node, not plain request inputs,
    so a view's decode Loop does not read the prefill's layout again (a node's output is used once)."""

    def prepare_inputs(self, calls: Sequence[NodeCall]) -> dict:
        return {"calls": list(calls)}

    def forward(self, calls: list[NodeCall]) -> dict[str, list[dict[str, torch.Tensor]]]:  # type: ignore[override]
        out = []
        for call in calls:
            values = {k: v for k, v in call.inputs.items() if k not in ("vae_embeds", "vit_embeds")}
            rows = [call.inputs[k] for k in ("vae_embeds", "vit_embeds") if k in call.inputs]
            for mask, port in (("embed_mask", "embeds"), ("cfg_text_embed_mask", "cfg_text_embeds")):
                if rows and mask in call.inputs:
                    values[port] = torch.cat(rows)
            out.append(values)
        return {"per_call": out}

    def split_outputs(self, outputs, calls):
        return outputs["per_call"]


class VaeDecoderNode(NodeSubmodule):
    """``x`` [N, p*p*C] latent tokens + ``gen_params`` (the grid) -> ``image`` [H, W, 3] uint8."""

    def __init__(self, vae: FluxAutoencoder, latent_patch: int, latent_channels: int) -> None:
        super().__init__()
        self.vae = vae
        self.latent_patch = latent_patch
        self.latent_channels = latent_channels

    def prepare_inputs(self, calls: Sequence[NodeCall]) -> dict:
        return {"calls": list(calls)}

    def forward(self, calls: list[NodeCall]) -> dict[str, list[torch.Tensor]]:  # type: ignore[override]
        dtype = next(self.vae.parameters()).dtype
        images = []
        for call in calls:
            params = GenerationParams.unpack(call.inputs["gen_params"])
            tokens = call.inputs["x"].reshape(params.num_tokens, -1)
            z = unpatchify_latent(tokens, params.grid_h, params.grid_w, self.latent_patch, self.latent_channels)
            pixels = self.vae.decode(z[None].to(dtype))[0]
            images.append(to_uint8_image(pixels))
        return {"image": images}

    def split_outputs(self, outputs, calls):
        return [{"image": img} for img in outputs["image"]]
