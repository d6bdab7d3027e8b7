"""BAGEL's stateless nodes: the two image encoders, the image rows of a context, the VAE decoder.

The encoders take each request's images (one, or several packed: mstar_graphs.bagel.image_pack) and batch
calls whatever their sizes; each returns one request's rows, image after image.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mstar.graph.node import NodeCall, NodeSubmodule
from mstar_graphs.bagel.autoencoder import FluxAutoencoder
from mstar_graphs.bagel.context_layout import GEN, UND, span_rows
from mstar_graphs.bagel.generation_params import GenerationParams
from mstar_graphs.bagel.image_pack import unpack_images
from mstar_graphs.bagel.latent_embed import LatentEmbedder
from mstar_graphs.bagel.latent_tokens import latent_pos_ids, patchify_latent, to_uint8_image, unpatchify_latent
from mstar_graphs.bagel.vision_encoder import BagelVisionEncoder


class VitEncoderNode(NodeSubmodule):
    """``image`` [3, H, W] in [-1, 1] (ViT-resized, H and W multiples of the patch), or several images packed
    with ``sizes`` [k, 2] (mstar_graphs.bagel.image_pack) -> ``embeds`` [sum N_i, Hd]: their rows in order.
    Every image of every call goes through one packed sequence (attention stays within each image), so
    calls batch whatever their sizes."""

    # linears whose .weight the encoder reads (for its dtype / device): kept plain by the engine
    plain_linears = ("encoder.connector.fc1", "encoder.vit_model.vision_model.embeddings.patch_embedding")

    def __init__(self, encoder: BagelVisionEncoder) -> None:
        super().__init__()
        self.encoder = encoder

    def batch_key(self, call: NodeCall) -> str:
        return "images"

    def prepare_inputs(self, calls: Sequence[NodeCall]) -> dict:
        return _calls_images(calls)

    def forward(self, image, per_call: list[int] | None = None) -> dict:  # type: ignore[override]
        """``image``: a batch [B, 3, H, W] (-> ``embeds`` [B, N, Hd]) or, from ``prepare_inputs``, a list of
        images with ``per_call`` (how many are each call's)."""
        dtype = next(self.encoder.parameters()).dtype
        rows = self.encoder([img.to(dtype) for img in image])
        if per_call is None:
            return {"embeds": torch.stack(rows)}
        return {"per_call": _per_call(rows, per_call)}

    def split_outputs(self, outputs, calls):
        if "per_call" in outputs:
            return [{"embeds": rows} for rows in outputs["per_call"]]
        return super().split_outputs(outputs, calls)


class VaeEncoderNode(NodeSubmodule):
    """``image`` [3, H, W] in [-1, 1] (VAE-resized, multiples of 16), or several packed with ``sizes`` [k, 2],
    -> ``embeds`` [sum N_i, Hd]: the clean latent tokens (the Gaussian's mean: deterministic) embedded at
    time 0, as a context image enters the LLM, image after image. Images of one size encode together."""

    plain_linears = ("embedder.vae2llm", "embedder.time_embedder.mlp.0")  # read for their dtype

    def __init__(self, vae: FluxAutoencoder, embedder: LatentEmbedder, latent_patch: int, latent_grid: int) -> None:
        super().__init__()
        self.vae = vae
        self.embedder = embedder
        self.latent_patch = latent_patch
        self.latent_grid = latent_grid

    def batch_key(self, call: NodeCall) -> str:
        return "images"

    def prepare_inputs(self, calls: Sequence[NodeCall]) -> dict:
        return _calls_images(calls)

    def forward(self, image, per_call: list[int] | None = None) -> dict:  # type: ignore[override]
        """``image``: a batch [B, 3, H, W] (-> ``embeds`` [B, N, Hd]) or a list with ``per_call``."""
        if per_call is None:
            return {"embeds": torch.stack(self._encode(image))}
        rows: list[torch.Tensor | None] = [None] * len(image)
        by_size: dict[tuple[int, int], list[int]] = {}
        for i, img in enumerate(image):
            by_size.setdefault(tuple(img.shape[-2:]), []).append(i)
        for indices in by_size.values():
            for i, encoded in zip(indices, self._encode(torch.stack([image[i] for i in indices]))):
                rows[i] = encoded
        return {"per_call": _per_call(rows, per_call)}

    def _encode(self, images: torch.Tensor) -> list[torch.Tensor]:
        """[B, 3, H, W] -> B tensors [N, Hd]."""
        first = next(self.vae.parameters())
        z = self.vae.encode(images.to(device=first.device, dtype=first.dtype))
        height, width = images.shape[-2:]
        ids = latent_pos_ids(height, width, 8 * self.latent_patch, self.latent_grid)
        return [self.embedder(patchify_latent(latent, self.latent_patch).to(first.dtype), 0.0, ids) for latent in z]

    def split_outputs(self, outputs, calls):
        if "per_call" in outputs:
            return [{"embeds": rows} for rows in outputs["per_call"]]
        return super().split_outputs(outputs, calls)


def _calls_images(calls: Sequence[NodeCall]) -> dict:
    """Every call's images in one list, and how many are each call's."""
    images: list[torch.Tensor] = []
    per_call: list[int] = []
    for call in calls:
        got = unpack_images(call.inputs["image"], call.inputs.get("sizes"))
        images.extend(got)
        per_call.append(len(got))
    return {"image": images, "per_call": per_call}


def _per_call(rows: Sequence, per_call: list[int]) -> list[torch.Tensor]:
    out, at = [], 0
    for n in per_call:
        out.append(torch.cat(list(rows[at : at + n])))
        at += n
    return out


class ContextNode(NodeSubmodule):
    """The three views' prefill inputs of one request: its laid-out ids, positions, spans and row kinds
    (request inputs, passed on) and each view's image rows in the order its spans come (as the reference
    appends an image: VAE span first, then ViT span; image after image) - as ``embeds`` for the full view
    and ``cfg_text_embeds`` for the no-text view, each only where that view's rows hold an image (an edit's
    full view that forks the no-text one brings only the instruction). A node, not plain request inputs,
    so a view's decode Loop does not read the prefill's layout again (a node's output is used once)."""

    def prepare_inputs(self, calls: Sequence[NodeCall]) -> dict:
        return {"calls": list(calls)}

    def forward(self, calls: list[NodeCall]) -> dict[str, list[dict[str, torch.Tensor]]]:  # type: ignore[override]
        out = []
        for call in calls:
            values = {k: v for k, v in call.inputs.items() if k not in ("vae_embeds", "vit_embeds")}
            sources = {
                kind: call.inputs[k] for kind, k in ((GEN, "vae_embeds"), (UND, "vit_embeds")) if k in call.inputs
            }
            for prefix, port in (("", "embeds"), ("cfg_text_", "cfg_text_embeds")):
                if sources and f"{prefix}embed_mask" in call.inputs:
                    values[port] = span_rows(call.inputs[f"{prefix}spans"], call.inputs[f"{prefix}row_kinds"], sources)
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
