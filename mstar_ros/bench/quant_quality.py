"""How close weight-only int8 / int4 decoding stays to bf16 on an Orpheus LLM checkpoint.

``quantization_quality(model_dir, "int8", steps=256)`` decodes greedily, slot-constrained as the
Orpheus graph decodes (each step reads the 4096 (+ end) head rows of its audio slot), with the bf16
model (linears packed as the engines pack them) and with a copy whose linears, LM head included,
are quantized as the engines quantize them. It returns:

- ``teacher_forced_agreement``: the quantized model fed the bf16 tokens picks the bf16 token at
  this fraction of steps (per-step quality, immune to one early divergence);
- ``free_agreement`` / ``free_prefix``: both decode on their own; fraction of equal positions and
  the length of the equal prefix;
- ``logits_max_abs_err`` / ``logits_mean_abs_err`` (teacher-forced, over the allowed rows) and
  ``logits_std`` for scale.

Run: MSTAR_TREE=$PWD OMP_NUM_THREADS=1 python -m mstar_ros.bench.quant_quality [--preset bench] [--steps 256]
(writes a random-weight checkpoint of the preset to a temporary directory unless --model-dir).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from mstar.layers.linear_packing import pack_linears
from mstar.layers.weight_only import check_quantization, quantize_module, quantized_count
from mstar_graphs.orpheus.llama import LlamaForCausalLM
from mstar_graphs.orpheus.prompt import build_prompt_ids, load_tokenizer
from mstar_graphs.orpheus.tokens import allowed_token_ids

PROMPT = "Hello there, how are you today? The weather was cold and rainy."


class _DenseAttention:
    """Contiguous K/V of one sequence, causal SDPA: a step's queries are the last T positions."""

    def __init__(self) -> None:
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        if layer in self.k:
            k, v = torch.cat([self.k[layer], k]), torch.cat([self.v[layer], v])
        self.k[layer], self.v[layer] = k, v
        t, total = q.shape[0], k.shape[0]
        mask = torch.ones(t, total, dtype=torch.bool).tril(diagonal=total - t)
        # fp32 attention: the comparison is about the linears, not SDPA's bf16 rounding
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1).float(),
            k.transpose(0, 1).float(),
            v.transpose(0, 1).float(),
            attn_mask=mask,
            scale=scale,
            enable_gqa=True,
        )
        return out.transpose(0, 1).to(q.dtype)


@torch.inference_mode()
def _decode(
    model: LlamaForCausalLM, prompt: list[int], steps: int, forced: list[int] | None = None
) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy slot-constrained tokens and each step's allowed-row logits (fp32); ``forced``: feed these."""
    attn = _DenseAttention()
    ids = torch.tensor(prompt)
    hidden = model(ids, torch.arange(len(prompt)), attn)[-1:]
    tokens: list[int] = []
    logits: list[torch.Tensor] = []
    for step in range(steps):
        allowed = allowed_token_ids(step)
        row = model.compute_logits(hidden, allowed)[0].float()
        logits.append(row)
        token = int(allowed[int(row.argmax())]) if forced is None else forced[step]
        tokens.append(token)
        hidden = model(torch.tensor([token]), torch.tensor([len(prompt) + step]), attn)
    return tokens, logits


def quantization_quality(
    model_dir: str | Path, quantization: str, steps: int = 256, dtype: torch.dtype = torch.bfloat16
) -> dict:
    """Quantized vs ``dtype`` decoding of the Orpheus LLM in ``model_dir`` (see the module docstring)."""
    check_quantization(quantization)
    reference = LlamaForCausalLM.from_pretrained_dir(model_dir, dtype=dtype, progress=False).fuse_projections()
    quantized = LlamaForCausalLM.from_pretrained_dir(model_dir, dtype=dtype, progress=False).fuse_projections()
    replaced = quantize_module(quantized, quantization)
    pack_linears(reference, reference.plain_linears)
    pack_linears(quantized, quantized.plain_linears)
    prompt = build_prompt_ids(load_tokenizer(model_dir), PROMPT)
    ref_tokens, ref_logits = _decode(reference, prompt, steps)
    forced_tokens, q_logits = _decode(quantized, prompt, steps, forced=ref_tokens)
    free_tokens, _ = _decode(quantized, prompt, steps)
    picks = [int(allowed_token_ids(i)[int(row.argmax())]) for i, row in enumerate(q_logits)]
    err = torch.cat([(q - r).abs() for q, r in zip(q_logits, ref_logits, strict=True)])
    prefix = next((i for i, (a, b) in enumerate(zip(free_tokens, ref_tokens, strict=True)) if a != b), steps)
    return {
        "quantization": quantization,
        "dtype": str(dtype).removeprefix("torch."),
        "steps": steps,
        "linears_quantized": replaced if quantization != "none" else 0,
        "head_quantized": quantized_count(quantized.lm_head) == 1,
        "teacher_forced_agreement": round(sum(p == r for p, r in zip(picks, ref_tokens, strict=True)) / steps, 4),
        "free_agreement": round(sum(a == b for a, b in zip(free_tokens, ref_tokens, strict=True)) / steps, 4),
        "free_prefix": prefix,
        "logits_max_abs_err": round(float(err.max()), 4),
        "logits_mean_abs_err": round(float(err.mean()), 4),
        "logits_std": round(float(torch.cat(ref_logits).std()), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path)
    parser.add_argument("--preset", default="bench", help="tiny-checkpoint preset when no --model-dir")
    parser.add_argument("--steps", type=int, default=256)
    parser.add_argument("--quantization", default="int8,int4")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir
        if model_dir is None:
            from mstar_graphs.orpheus.tiny_llm import write_tiny_llm

            model_dir = write_tiny_llm(Path(tmp) / args.preset, preset=args.preset)
        for mode in args.quantization.split(","):
            result = quantization_quality(model_dir, mode, steps=args.steps)
            print(json.dumps({"model": args.model_dir and str(args.model_dir) or args.preset, **result}), flush=True)


if __name__ == "__main__":
    main()
