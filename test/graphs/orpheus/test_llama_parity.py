"""Our Llama vs transformers' on the same random Orpheus-shaped checkpoint directory."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from mstar.weights import WeightsError
from mstar_graphs.orpheus.llama import LlamaForCausalLM, llama_inv_freq
from mstar_graphs.orpheus.prompt import build_prompt_ids, load_tokenizer
from mstar_graphs.orpheus.tiny_llm import write_tiny_llm
from mstar_graphs.orpheus.tokens import END_OF_SPEECH, VOCAB_SIZE, allowed_token_ids, audio_token

transformers = pytest.importorskip("transformers")

DECODE_STEPS = 64


class DenseCausalAttention:
    """Test-only attention context: contiguous per-layer K/V of ONE sequence, causal SDPA.

    The step's tokens are the last ``T`` of the sequence so far, so query ``t`` sees
    keys ``0 .. past + t``.
    """

    def __init__(self) -> None:
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        if layer in self.k:
            k = torch.cat([self.k[layer], k])
            v = torch.cat([self.v[layer], v])
        self.k[layer], self.v[layer] = k, v
        t, total = q.shape[0], k.shape[0]
        mask = torch.ones(t, total, dtype=torch.bool).tril(diagonal=total - t)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale, enable_gqa=True
        )
        return out.transpose(0, 1)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory):
    return write_tiny_llm(tmp_path_factory.mktemp("orpheus_tiny_llm"))


@pytest.fixture(scope="module")
def ours(ckpt) -> LlamaForCausalLM:
    return LlamaForCausalLM.from_pretrained_dir(ckpt, dtype=torch.float32, progress=False)


@pytest.fixture(scope="module")
def theirs(ckpt):
    model = transformers.LlamaForCausalLM.from_pretrained(ckpt, local_files_only=True, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def prompt(ckpt) -> list[int]:
    ids = build_prompt_ids(load_tokenizer(ckpt), "Hello there, how are you today? The weather was cold.")
    # A few audio tokens too, so the prompt spans text, specials and audio embeddings.
    return ids + [audio_token(c, s) for s, c in enumerate((5, 4000, 17, 2048, 99, 3, 1234))]


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_checkpoint_is_sharded_hf_layout(ckpt, ours):
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 2
    # Our parameter names are the checkpoint names, one to one.
    assert set(index["weight_map"]) == set(ours.state_dict())
    assert ours.vocab_size == VOCAB_SIZE and ours.max_positions == 2048
    spec = ours.kv_spec()
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim) == (2, 2, 16)


def test_llama3_rope_frequencies_match_transformers(ours, theirs):
    rotary = theirs.model.rotary_emb
    assert rotary.rope_type == "llama3"
    ref = rotary.inv_freq.float()
    got = llama_inv_freq(ours.config)
    assert not torch.allclose(got, 1.0 / 10000 ** (torch.arange(0, 16, 2).float() / 16))  # scaling is active
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=0)


@torch.no_grad()
def test_prefill_logits_match_transformers(ours, theirs, prompt):
    ids = torch.tensor(prompt)
    hidden = ours(ids, torch.arange(len(prompt)), DenseCausalAttention())
    logits = ours.compute_logits(hidden)
    ref = theirs(ids[None]).logits[0]
    assert logits.shape == ref.shape == (len(prompt), VOCAB_SIZE)
    assert _rel_err(logits, ref) < 1e-4


@torch.no_grad()
def test_chunked_prefill_equals_one_shot(ours, prompt):
    ids, pos = torch.tensor(prompt), torch.arange(len(prompt))
    whole = ours(ids, pos, DenseCausalAttention())
    attn = DenseCausalAttention()
    cut = len(prompt) // 3
    parts = [ours(ids[:cut], pos[:cut], attn), ours(ids[cut:], pos[cut:], attn)]
    torch.testing.assert_close(torch.cat(parts), whole, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_restricted_logits_equal_full_columns(ours, prompt):
    hidden = ours(torch.tensor(prompt), torch.arange(len(prompt)), DenseCausalAttention())[-3:]
    full = ours.compute_logits(hidden)
    for n in (0, 3):
        ids = allowed_token_ids(n)
        torch.testing.assert_close(ours.compute_logits(hidden, ids), full[:, ids], rtol=1e-6, atol=1e-5)
    scattered = torch.tensor([156939, 0, 128258, 77, 140000])  # unsorted, any rows
    torch.testing.assert_close(ours.compute_logits(hidden, scattered), full[:, scattered], rtol=1e-6, atol=1e-5)


@torch.no_grad()
def test_greedy_constrained_decode_matches_generate(ours, theirs, prompt):
    n_prompt = len(prompt)

    def allowed(_batch: int, input_ids: torch.Tensor) -> list[int]:
        return allowed_token_ids(input_ids.shape[-1] - n_prompt).tolist()

    ref = theirs.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, n_prompt, dtype=torch.long),
        do_sample=False,
        max_new_tokens=DECODE_STEPS,
        prefix_allowed_tokens_fn=allowed,
        eos_token_id=END_OF_SPEECH,
        pad_token_id=END_OF_SPEECH,
    )[0, n_prompt:].tolist()

    attn = DenseCausalAttention()
    hidden = ours(torch.tensor(prompt), torch.arange(n_prompt), attn)[-1:]
    got: list[int] = []
    for n in range(DECODE_STEPS):
        ids = allowed_token_ids(n)
        token = int(ids[ours.compute_logits(hidden, ids).argmax(-1)])
        got.append(token)
        if token == END_OF_SPEECH:
            break
        hidden = ours(torch.tensor([token]), torch.tensor([n_prompt + n]), attn)

    assert got == ref
    assert len(set(got)) > 10  # a real trajectory, not one token repeated


def test_missing_weights_are_an_error(ckpt, tmp_path):
    (tmp_path / "config.json").write_text((ckpt / "config.json").read_text())
    from safetensors.torch import load_file

    from mstar.weights import save_safetensors

    shard = sorted(ckpt.glob("model-*.safetensors"))[0]
    save_safetensors(load_file(str(shard)), tmp_path)
    with pytest.raises(WeightsError, match="missing"):
        LlamaForCausalLM.from_pretrained_dir(tmp_path, progress=False)


@torch.no_grad()
def test_tied_head_checkpoint_matches_transformers(tmp_path, prompt):
    # Llama 3.2 3B (the real Orpheus base) ties lm_head to the embeddings and stores no lm_head.weight.
    from mstar.weights import save_safetensors
    from mstar_graphs.orpheus.tiny_llm import config_dict, random_state_dict

    cfg = {**config_dict("tiny"), "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    state = random_state_dict(cfg)
    assert "lm_head.weight" not in state
    save_safetensors(state, tmp_path)
    ours = LlamaForCausalLM.from_pretrained_dir(tmp_path, progress=False)
    assert ours.lm_head.weight is ours.model.embed_tokens.weight
    theirs = transformers.LlamaForCausalLM.from_pretrained(tmp_path, local_files_only=True, dtype=torch.float32).eval()
    ids = torch.tensor(prompt)
    logits = ours.compute_logits(ours(ids, torch.arange(len(prompt)), DenseCausalAttention()))
    assert _rel_err(logits, theirs(ids[None]).logits[0]) < 1e-4
