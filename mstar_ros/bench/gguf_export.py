"""An HF Llama checkpoint directory (our generated Orpheus LLM) written as a GGUF file for llama.cpp.

Our own writer over the ``gguf`` package's GGUFWriter, following the facts llama.cpp's loader
expects of the ``llama`` architecture:
- tensor names ``token_embd``, ``blk.N.attn_{norm,q,k,v,output}``, ``blk.N.ffn_{norm,gate,up,down}``,
  ``output_norm`` and, only when the head is not tied, ``output``;
- q and k rows permuted from HF's rotate-half RoPE layout to the adjacent-pairs layout llama.cpp's
  "normal" RoPE rotates (within each head, row ``2*i + j`` of the result is HF row ``j*d/2 + i``);
- llama3 RoPE scaling as a ``rope_freqs`` tensor of per-frequency divisors;
- 2-D weights in F16, 1-D ones (norms, rope_freqs) in F32;
- no tokenizer: ``tokenizer.ggml.model = "none"`` with ``llama.vocab_size`` makes llama.cpp add
  dummy tokens, and callers feed token ids.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mstar.weights.checkpoint_files import iter_checkpoint_tensors

GGUF_FTYPE_F16 = 1  # llama_ftype LLAMA_FTYPE_MOSTLY_F16: F16 except 1-D tensors

_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_TOP_NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def gguf_tensor_name(hf_name: str) -> str:
    """llama.cpp's name of an HF Llama weight (``model.layers.3.mlp.up_proj.weight`` -> ``blk.3.ffn_up.weight``)."""
    stem, suffix = hf_name.rsplit(".", 1)
    if stem in _TOP_NAMES:
        return f"{_TOP_NAMES[stem]}.{suffix}"
    parts = stem.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in _LAYER_NAMES:
        return f"blk.{int(parts[2])}.{_LAYER_NAMES[parts[3]]}.{suffix}"
    raise ValueError(f"no GGUF name for Llama weight {hf_name!r}")


def rope_pairs_permute(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """q/k rows [heads*d, ...] from rotate-half (HF) to adjacent-pairs (llama.cpp) order, per head."""
    rows = weight.shape[0]
    half = rows // num_heads // 2
    return weight.reshape(num_heads, 2, half, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def llama3_rope_divisors(config: dict[str, Any]) -> torch.Tensor | None:
    """Per-frequency divisors of llama3 RoPE scaling [head_dim/2] (None without llama3 scaling)."""
    scaling = config.get("rope_scaling") or {}
    if scaling.get("rope_type", scaling.get("type")) != "llama3":
        return None
    dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    inv_freq = 1.0 / (config.get("rope_theta", 10000.0) ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    factor, old_len = scaling["factor"], scaling["original_max_position_embeddings"]
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    divisors = []
    for freq in inv_freq.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < old_len / high:  # short wavelengths are kept
            divisors.append(1.0)
        elif wavelen > old_len / low:  # long ones slowed down by the whole factor
            divisors.append(factor)
        else:  # blended in 1/wavelength between the two
            smooth = (old_len / wavelen - low) / (high - low)
            divisors.append(1.0 / ((1 - smooth) / factor + smooth))
    return torch.tensor(divisors, dtype=torch.float32)


def _gguf_tensors(llm_dir: Path, config: dict[str, Any]) -> Iterator[tuple[str, np.ndarray]]:
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    for name, tensor in iter_checkpoint_tensors(llm_dir):
        if name == "lm_head.weight" and config.get("tie_word_embeddings", False):
            continue  # llama.cpp reuses token_embd when there is no output tensor
        if name.endswith("q_proj.weight"):
            tensor = rope_pairs_permute(tensor, heads)
        elif name.endswith("k_proj.weight"):
            tensor = rope_pairs_permute(tensor, kv_heads)
        dtype = np.float16 if tensor.dim() >= 2 else np.float32
        yield gguf_tensor_name(name), tensor.float().numpy().astype(dtype)
    divisors = llama3_rope_divisors(config)
    if divisors is not None:
        yield "rope_freqs.weight", divisors.numpy()


def export_gguf(llm_dir: str | Path, out_path: str | Path, *, name: str = "orpheus-llm") -> Path:
    """Write ``llm_dir`` (HF Llama: config.json + safetensors) as an F16 GGUF at ``out_path``; returns it."""
    import gguf

    llm_dir, out_path = Path(llm_dir), Path(out_path)
    config = json.loads((llm_dir / "config.json").read_text())
    if config.get("model_type") != "llama":
        raise ValueError(f"{llm_dir}: model_type {config.get('model_type')!r}, expected 'llama'")
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    writer = gguf.GGUFWriter(out_path, "llama")  # writes general.architecture itself
    writer.add_name(name)
    writer.add_file_type(GGUF_FTYPE_F16)
    writer.add_vocab_size(config["vocab_size"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config.get("num_key_value_heads", heads))
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(config.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    writer.add_tokenizer_model("none")  # no vocabulary: token ids are fed directly
    if config.get("mstar_random_weights"):
        writer.add_description("random weights (mstar_ros generated checkpoint)")
    for gguf_name, array in _gguf_tensors(llm_dir, config):
        writer.add_tensor(gguf_name, array)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path
