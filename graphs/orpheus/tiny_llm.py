"""Deterministic random Llama checkpoints in the real Orpheus/HF layout, for tests and benchmarks.

``write_tiny_llm(dir)`` writes what a downloaded Orpheus LLM directory holds:
``config.json`` (HF field names, plus ``"mstar_random_weights": true``), sharded
safetensors with ``model.safetensors.index.json``, and a ``tokenizer.json``
(a small byte-level BPE whose Llama 3 specials keep their real ids). The
vocabulary is the real Orpheus one (156940) so every audio token id is valid.

Initialisation (chosen so greedy decoding is decided by clear margins, not float ties):
embeddings and an untied ``lm_head`` ~ N(0, 1), so logits over the final RMS-normed
hidden have a spread of about sqrt(hidden_size) (8 for "tiny"): neighbouring top
candidates differ by ~0.1-1, far above fp32 round-off (~1e-5). Projections ~
N(0, 1/fan_in) so every layer changes the residual stream by O(1) and attention is
neither uniform nor one-hot; norm weights ~ 1 + N(0, 0.1^2) so a missing norm shows.
Same seed, same torch version -> same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from mstar.weights import save_safetensors
from mstar_graphs.orpheus.tokens import BEGIN_OF_TEXT, EOT, VOCAB_SIZE

SEED = 20240611
TEXT_VOCAB = 512  # BPE tokens of the toy tokenizer (ids 0..511)
# Llama 3 specials at their real ids, so prompts look like the real ones.
SPECIAL_TOKENS = {"<|begin_of_text|>": BEGIN_OF_TEXT, "<|end_of_text|>": 128001, "<|eot_id|>": EOT}

# What the bench presets keep of Llama 3.2 3B beside their sizes: its RoPE, context and tied head.
_LLAMA_3B_LIKE: dict[str, Any] = dict(
    max_position_embeddings=16384,
    tie_word_embeddings=True,
    rope_theta=500000.0,
    rope_scaling={
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    torch_dtype="bfloat16",
)

PRESETS: dict[str, dict[str, Any]] = {
    # Fast enough for unit tests; llama3 rope numbers chosen so all three frequency bands
    # (kept, blended, scaled) occur with head_dim 16.
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        rope_theta=10000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        torch_dtype="float32",
    ),
    # Orpheus-shaped (GQA 2:1, head_dim 64, llama3 rope, tied head as in Llama 3.2 3B) but small
    # enough for a 2-core CPU, big enough that compute dominates Python overhead.
    "bench": dict(
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        **_LLAMA_3B_LIKE,
    ),
    # For `bench decode`: the real 3B's balance. Orpheus 3B (Llama 3.2 3B: hidden 3072, 28 layers,
    # MLP 8192, GQA 24/8 heads of 128, tied 156940-row head) spends 482M of its 3.30B weights
    # (14.6%) on the head; with the real vocabulary the share depends only on layers x hidden, so
    # 108 x 768 keeps it (15.1%: 120.5M of 800M) with the 3B's exact ratios (MLP 8/3, GQA 3:1,
    # head_dim 128). 768 and 2048 are multiples of 256, so llama.cpp's Q4_K quantizes every
    # matrix (its rows must be): hidden 1152 or 1280 would make it fall back to other types.
    "decode": dict(
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=108,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=128,
        **_LLAMA_3B_LIKE,
    ),
}

_CORPUS = """\
The quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun.
Hello there, how are you today? I am fine, thank you, and I hope you are well too.
Speech synthesis turns written text into sound that people can hear and understand.
A good voice speaks clearly, with natural rhythm, pauses, and a little bit of emotion.
She sells sea shells by the sea shore, and the shells she sells are surely sea shells.
Please read the next sentence slowly: numbers like one, two, three and four are easy.
The weather was cold and rainy, so we stayed inside, drank tea and told old stories.
Robots on the factory floor talk to each other over a fast network with low latency.
Can you hear me now? Yes, I can hear you loud and clear, the line is very good.
Every morning the baker opens the shop at six and the bread smells wonderful.
Music, laughter and quiet whispers all carry meaning beyond the words themselves.
Tara said: let us begin, and then she laughed, sighed, and started to read aloud.
"""


def config_dict(preset: str = "tiny") -> dict[str, Any]:
    """The HF ``config.json`` content of a preset."""
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB_SIZE,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": BEGIN_OF_TEXT,
        "eos_token_id": EOT,
        "pad_token_id": 128004,
        **PRESETS[preset],
        "mstar_random_weights": True,
    }


def _weight_shapes(cfg: dict[str, Any]) -> list[tuple[str, tuple[int, ...], str]]:
    """(HF name, shape, init kind) in HF module order; written out independently of our model."""
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    q = cfg["num_attention_heads"] * cfg["head_dim"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    out: list[tuple[str, tuple[int, ...], str]] = [("model.embed_tokens.weight", (v, h), "unit")]
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        out += [
            (p + "self_attn.q_proj.weight", (q, h), "proj"),
            (p + "self_attn.k_proj.weight", (kv, h), "proj"),
            (p + "self_attn.v_proj.weight", (kv, h), "proj"),
            (p + "self_attn.o_proj.weight", (h, q), "proj"),
            (p + "mlp.gate_proj.weight", (i, h), "proj"),
            (p + "mlp.up_proj.weight", (i, h), "proj"),
            (p + "mlp.down_proj.weight", (h, i), "proj"),
            (p + "input_layernorm.weight", (h,), "norm"),
            (p + "post_attention_layernorm.weight", (h,), "norm"),
        ]
    out.append(("model.norm.weight", (h,), "norm"))
    if not cfg["tie_word_embeddings"]:  # tied checkpoints (HF) store no lm_head.weight
        out.append(("lm_head.weight", (v, h), "unit"))
    return out


def random_state_dict(cfg: dict[str, Any], seed: int = SEED) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, cfg.get("torch_dtype", "float32"))
    state: dict[str, torch.Tensor] = {}
    for name, shape, kind in _weight_shapes(cfg):
        t = torch.randn(shape, generator=gen, dtype=torch.float32)
        if kind == "proj":
            t *= shape[1] ** -0.5
        elif kind == "norm":
            t = 1.0 + 0.1 * t
        state[name] = t.to(dtype)
    return state


def build_tokenizer() -> Any:
    """A small deterministic byte-level BPE with the Llama 3 specials at their real ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TEXT_VOCAB,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(_CORPUS.splitlines(), trainer=trainer)

    # The trainer numbers tokens 0..N; move the specials to their Llama 3 ids through the
    # JSON form (the Python API cannot pick ids), and prepend BOS like Llama 3's post-processor.
    data = json.loads(tok.to_str())
    data["model"]["vocab"].update(SPECIAL_TOKENS)
    data["added_tokens"] = [
        {
            "id": tid,
            "content": text,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for text, tid in SPECIAL_TOKENS.items()
    ]
    bos = "<|begin_of_text|>"
    data["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [
            {"SpecialToken": {"id": bos, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": bos, "type_id": 1}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {bos: {"id": bos, "ids": [BEGIN_OF_TEXT], "tokens": [bos]}},
    }
    return Tokenizer.from_str(json.dumps(data))


def write_tiny_llm(directory: str | Path, preset: str = "tiny") -> Path:
    """Write a random Llama checkpoint directory (config, sharded weights, tokenizer); returns it."""
    cfg = config_dict(preset)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")

    state = random_state_dict(cfg)
    total = sum(t.nbytes for t in state.values())
    # A third of the total forces >= 2 shards, so every user of these checkpoints
    # exercises the sharded index path that real multi-GB checkpoints take.
    # No extra safetensors metadata: with more than one key, the header's key order is not
    # stable across runs (a hash map), and these files must be byte-identical every time.
    save_safetensors(state, out, max_shard_bytes=max(1, total // 3))

    build_tokenizer().save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<|begin_of_text|>",
                "eos_token": "<|eot_id|>",
                "model_max_length": cfg["max_position_embeddings"],
            },
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )
    return out
