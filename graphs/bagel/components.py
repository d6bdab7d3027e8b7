"""BAGEL for Worker processes: the graph plus only the submodules a Worker hosts.

Registered as the model ``bagel`` (setup.py entry_points["mstar.models"]): a rank that runs only the
ViT never loads the LLM or the VAE; the VAE is loaded once for the encoder and the decoders.
"""

from __future__ import annotations

from pathlib import Path

import torch

from mstar.graph.model_graph import ModelGraph
from mstar.graph.node import NodeSubmodule
from mstar.worker.protocol import ModelSpec
from mstar_graphs.bagel.checkpoints import resolve_path
from mstar_graphs.bagel.config import BagelConfig
from mstar_graphs.bagel.graph import MODULE, bagel_graph
from mstar_graphs.bagel.tokenizer import BagelTokenizer

MODEL = "bagel"  # its registered name
LLM_NODES = frozenset(
    {
        "llm",
        "llm_cfg_text",
        "llm_cfg_img",
        "think",
        "image",
        "image_cfg",
        "velocity",
        "velocity_cfg_text",
        "velocity_cfg_img",
    }
)


def bagel_spec(weights: str | Path | None = None, *, preset: str = "tiny", dtype: str = "float32") -> ModelSpec:
    return ModelSpec(MODEL, {"weights": None if weights is None else str(weights), "preset": preset, "dtype": dtype})


def bagel_components(
    nodes: set[str],
    weights: str | None = None,
    preset: str = "tiny",
    progress: bool = False,
    tp=None,
    dtype: str = "float32",
) -> tuple[ModelGraph, dict[str, NodeSubmodule]]:
    if tp is not None:
        raise ValueError("BAGEL does not support tensor parallelism yet")
    path = resolve_path(weights, preset)
    tokenizer = BagelTokenizer.from_dir(path)
    graph = bagel_graph(tokenizer.special.im_end)
    return graph, load_modules(path, nodes, dtype=getattr(torch, dtype), progress=progress)


def load_modules(
    path: Path, nodes: set[str], *, dtype: torch.dtype = torch.float32, progress: bool = False
) -> dict[str, NodeSubmodule]:
    """The submodules behind ``nodes`` (all of them: every node of the graph)."""
    from mstar_graphs.bagel.nodes import ContextNode, VaeDecoderNode, VaeEncoderNode, VitEncoderNode

    config = BagelConfig.from_dir(path)
    d, hidden = config.dims, config.llm.hidden_size
    modules: dict[str, NodeSubmodule] = {}
    if nodes & LLM_NODES:
        from mstar_graphs.bagel.flow_llm import BagelFlowLLM

        modules[MODULE] = BagelFlowLLM.from_pretrained_dir(path, dtype=dtype, progress=progress)
    if "vit_encoder" in nodes:
        from mstar_graphs.bagel.vision_encoder import BagelVisionEncoder

        encoder = BagelVisionEncoder.from_pretrained_dir(
            path,
            None,
            hidden,
            d.vit_max_num_patch_per_side,
            connector_act=d.connector_act,
            dtype=dtype,
            progress=progress,
        )
        modules["vit_encoder"] = VitEncoderNode(encoder.eval())
    if nodes & {"vae_encoder", "vae_decoder", "preview_decoder"}:
        from mstar_graphs.bagel.autoencoder import FluxAutoencoder

        vae = FluxAutoencoder.from_file(path, dtype=dtype, progress=progress).eval()
        if "vae_encoder" in nodes:
            from mstar_graphs.bagel.latent_embed import LatentEmbedder

            embedder = LatentEmbedder.from_pretrained_dir(
                path, hidden, d.max_latent_size, d.latent_patch_size, d.latent_channels, dtype=dtype, progress=progress
            )
            modules["vae_encoder"] = VaeEncoderNode(vae, embedder.eval(), d.latent_patch_size, d.max_latent_size)
        for name in sorted({"vae_decoder", "preview_decoder"} & set(nodes)):  # the same VAE decodes previews
            modules[name] = VaeDecoderNode(vae, d.latent_patch_size, d.latent_channels)
    if "context" in nodes:
        modules["context"] = ContextNode()
    if "cfg_step" in nodes:
        from mstar_graphs.bagel.cfg_parallel import CfgStepNode

        modules["cfg_step"] = CfgStepNode()
    return modules
