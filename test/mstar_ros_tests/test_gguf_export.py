"""GGUF export of the generated Orpheus LLM: names, the q/k RoPE permutation, llama3 divisors, and
llama.cpp's F16 (and Q8_0) logits against the transformers fp32 reference on the same checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mstar.weights import save_safetensors
from mstar_graphs.common.rope import rope_inv_freq
from mstar_graphs.orpheus.config import LlamaConfig
from mstar_graphs.orpheus.llama import llama_inv_freq
from mstar_graphs.orpheus.reference import load_hf_llm
from mstar_graphs.orpheus.tiny_llm import config_dict, random_state_dict
from mstar_ros.bench.gguf_export import export_gguf, gguf_tensor_name, llama3_rope_divisors, rope_pairs_permute
from mstar_ros.bench.gguf_files import quantize_gguf
from mstar_ros.bench.llama_cpp_runner import LlamaCppDecoder

PROMPT = [128000, 5, 77, 300, 1000, 128257, 130000, 150000, 42, 7, 9000, 64000]


def test_tensor_names_follow_llama_cpp():
    assert gguf_tensor_name("model.embed_tokens.weight") == "token_embd.weight"
    assert gguf_tensor_name("model.layers.11.self_attn.o_proj.weight") == "blk.11.attn_output.weight"
    assert gguf_tensor_name("model.layers.0.post_attention_layernorm.weight") == "blk.0.ffn_norm.weight"
    assert gguf_tensor_name("model.norm.weight") == "output_norm.weight"
    assert gguf_tensor_name("lm_head.weight") == "output.weight"
    with pytest.raises(ValueError, match="no GGUF name"):
        gguf_tensor_name("model.layers.0.mlp.experts.weight")


def _rotate_half(x: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * angle.cos() - b * angle.sin(), b * angle.cos() + a * angle.sin()], -1)


def _adjacent_pairs(x: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * angle.cos() - b * angle.sin(), b * angle.cos() + a * angle.sin()], -1).flatten(-2)


def test_permuted_rows_under_adjacent_pair_rope_equal_hf_rope():
    heads, d, hidden = 3, 8, 5
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(heads * d, hidden, generator=g), torch.randn(hidden, generator=g)
    angle = 0.7 * rope_inv_freq(d, 10000.0)
    hf = _rotate_half((w @ x).view(heads, d), angle)
    ours = _adjacent_pairs((rope_pairs_permute(w, heads) @ x).view(heads, d), angle)
    # the dot products attention takes are what must agree: q.k within a head
    assert torch.allclose((hf * hf.flip(0)).sum(-1), (ours * ours.flip(0)).sum(-1), atol=1e-5)
    assert not torch.allclose(rope_pairs_permute(w, heads), w)


@pytest.mark.parametrize("preset", ["tiny", "decode"])
def test_llama3_divisors_give_our_scaled_frequencies(preset):
    cfg = config_dict(preset)
    ours = llama_inv_freq(LlamaConfig.from_dict(cfg))
    base = rope_inv_freq(cfg["head_dim"], cfg["rope_theta"])
    divisors = llama3_rope_divisors(cfg)
    assert divisors is not None and divisors.min() == 1.0 and divisors.max() == cfg["rope_scaling"]["factor"]
    assert torch.allclose(base / divisors, ours, rtol=1e-5)


def _checkpoint(directory, tied: bool):
    cfg = {**config_dict("tiny"), "tie_word_embeddings": tied}
    save_safetensors(random_state_dict(cfg), directory)
    (directory / "config.json").write_text(json.dumps(cfg))
    return directory


@pytest.mark.parametrize("tied", [False, True])
def test_llama_cpp_f16_logits_match_the_fp32_reference(tmp_path, tied):
    llm = _checkpoint(tmp_path / "llm", tied)
    f16 = export_gguf(llm, tmp_path / "f16.gguf")
    with torch.no_grad():
        ref = load_hf_llm(llm, torch.float32)(torch.tensor([PROMPT])).logits[0].numpy()
    with LlamaCppDecoder(f16, threads=1, streams=1, per_stream_tokens=32, extra_buffers=False) as llama:
        assert llama.n_vocab == 156940
        got = llama.prompt_logits(PROMPT)
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() / np.abs(ref).max() < 5e-3  # F16 weights, fp32 reference
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.9

    q8 = quantize_gguf(f16, tmp_path / "q8.gguf", "Q8_0")
    assert q8.stat().st_size < 0.6 * f16.stat().st_size
    with LlamaCppDecoder(q8, threads=1, streams=1, per_stream_tokens=32, extra_buffers=False) as llama:
        q8_logits = llama.prompt_logits(PROMPT)
    assert np.abs(q8_logits - ref).max() / np.abs(ref).max() < 5e-2


def test_batched_streams_decode_like_single_ones(tmp_path):
    f16 = export_gguf(_checkpoint(tmp_path / "llm", True), tmp_path / "f16.gguf")
    prompts = [PROMPT[:5], PROMPT[3:9], PROMPT[6:]]
    with LlamaCppDecoder(f16, threads=1, streams=3, per_stream_tokens=32, extra_buffers=False) as llama:
        together, seconds = llama.greedy(prompts, 6)
        alone = [llama.greedy([p], 6)[0][0] for p in prompts]
    assert seconds > 0 and [len(t) for t in together] == [6, 6, 6]
    assert together == alone
