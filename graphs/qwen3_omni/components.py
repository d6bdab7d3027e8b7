"""Qwen3-Omni for Worker processes: the graph plus only the submodules a Worker hosts.

Registered as the model ``qwen3_omni`` (setup.py entry_points["mstar.models"]), so
``ModelSpec("qwen3_omni", {...})`` names it. Each Worker calls it with the nodes the placement
gives it (the Conductor with none). ``talker_inputs`` shares the Talker's projections, so the two
sit on one rank (config/placement/qwen3-omni-two-ranks.yaml: the Thinker and its audio encoder on
rank 0, Talker and Code2Wav on rank 1); it also reads the Thinker's token embeddings, which a rank
without the Thinker loads alone. With ``tp`` (a tensor-parallel group, e.g.
config/placement/qwen3-omni-thinker-tp2.yaml) the Thinker is loaded whole and sharded
(``tensor_parallel.shard_thinker``); the Talker's nodes then sit on a rank outside the group.
"""

from __future__ import annotations

from pathlib import Path

import torch

from mstar.graph.model_graph import ModelGraph
from mstar.graph.node import NodeSubmodule
from mstar.weights import load_weights
from mstar.worker.protocol import ModelSpec
from mstar_graphs.qwen3_omni.checkpoints import ensure_tiny_qwen3_omni, load_component
from mstar_graphs.qwen3_omni.config import Qwen3OmniConfig
from mstar_graphs.qwen3_omni.graph import qwen3_omni_graph

MODEL = "qwen3_omni"  # its registered name


def qwen3_omni_spec(
    weights: str | Path | None = None, *, preset: str = "tiny", first_chunk: int | None = None
) -> ModelSpec:
    return ModelSpec(
        MODEL, {"weights": None if weights is None else str(weights), "preset": preset, "first_chunk": first_chunk}
    )


def thinker_embeddings(path: Path, config: Qwen3OmniConfig) -> torch.nn.Embedding:
    """The Thinker's token embedding table alone (for a rank that hosts the Talker but not the Thinker)."""
    text = config.thinker_config.text_config
    holder = torch.nn.Module()
    holder.embed_tokens = torch.nn.Embedding(text.vocab_size, text.hidden_size)
    load_weights(
        holder,
        path,
        name_map=lambda n: "embed_tokens.weight" if n == "thinker.model.embed_tokens.weight" else None,
        progress=False,
    )
    return holder.embed_tokens


def qwen3_omni_components(
    nodes: set[str],
    weights: str | None = None,
    preset: str = "tiny",
    first_chunk: int | None = None,
    progress: bool = False,
    tp=None,
) -> tuple[ModelGraph, dict[str, NodeSubmodule]]:
    sharded = tp is not None and tp.size > 1
    if sharded and nodes & {"talker", "talker_inputs", "code2wav"} and "thinker" in nodes:
        raise ValueError("tensor parallelism shards the Thinker: place the Talker's nodes on a rank of their own")
    if sharded and "thinker" not in nodes:
        raise ValueError(
            f"a tensor-parallel group of Qwen3-Omni shards the Thinker; this rank's nodes are {sorted(nodes)}"
        )
    path = Path(weights) if weights is not None else ensure_tiny_qwen3_omni(preset)
    config = Qwen3OmniConfig.from_dir(path)
    graph = qwen3_omni_graph(config.im_end_token_id, config.talker_config.codec_eos_token_id, first_chunk)
    modules: dict[str, NodeSubmodule] = {}
    for name in ("audio_encoder", "vision_encoder", "thinker", "talker", "code2wav"):
        if name in nodes or (name == "talker" and "talker_inputs" in nodes):
            modules[name] = load_component(name, path, progress=progress)
    if sharded:
        from mstar_graphs.qwen3_omni.tensor_parallel import shard_thinker

        modules["thinker"] = shard_thinker(modules["thinker"], tp)
    if "talker_inputs" in nodes:
        from mstar_graphs.qwen3_omni.talker_inputs_node import TalkerInputsNode

        if "talker" not in nodes:
            raise ValueError("talker_inputs shares the Talker's projections: place it on the Talker's rank")
        embed = modules["thinker"].model.embed_tokens if "thinker" in modules else thinker_embeddings(path, config)
        modules["talker_inputs"] = TalkerInputsNode(modules["talker"], embed)
    if nodes & {"audio_frames", "audio_prompt", "image_positions", "media_prompt"}:
        from mstar_graphs.qwen3_omni.model import stream_nodes

        modules.update(stream_nodes(config))
    return graph, {k: v for k, v in modules.items() if k in nodes}
