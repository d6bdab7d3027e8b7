"""The GPU path checks, in one script: what a session lent a GPU runs first (CI runs it on CPU).

    python tools/gpu_check.py --device cuda [--json gpu-check.json]
    python tools/gpu_check.py --device cpu          # the same checks through the CPU paths

1. attention: the paged-attention cases of test/support/attention_cases.py (every mask kind,
   chunked prefill, GQA, mixed prefill + decode with out-of-order rows, eviction offsets)
   through the backend the runtime picks for the device -- FlashInfer on CUDA when
   installed -- against float64 dense attention, in the device's serving dtype.
2. Orpheus: the tiny checkpoint served by a Conductor on the device (bf16 on CUDA) against
   the same requests served on CPU in fp32: greedy tokens (first divergence reported) and
   audio produced.
3. pi0.5: the tiny checkpoint served on the device against the dense direct reference on CPU
   in fp32 (max abs difference of the action chunks).

Hard failures (exit 1): an exception, a wrong backend, attention error over tolerance,
non-finite or missing outputs. Token agreement and action error are reported (bf16 vs fp32
may legitimately differ); the JSON holds every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "test"))  # the shared attention cases

ATTENTION_CASES = {
    "prefill causal": [{"ctx": 13, "ql": 13}],
    "prefill prefix-bidirectional": [{"ctx": 13, "ql": 13, "mask": 1, "arg": 7}],
    "prefill block-causal": [{"ctx": 13, "ql": 13, "mask": 2, "arg": 3}],
    "chunked prefill prefix-bidirectional": [{"ctx": 15, "ql": 6, "mask": 1, "arg": 12}],
    "chunked prefill block-causal": [{"ctx": 15, "ql": 6, "mask": 2, "arg": 5}],
    "decode batch": [{"ctx": c, "ql": 1} for c in (3, 40, 17, 8, 1)],
    "mixed, rows out of order": [
        {"ctx": 17, "ql": 17},
        {"ctx": 1, "ql": 1},
        {"ctx": 22, "ql": 5, "mask": 1, "arg": 19},
        {"ctx": 30, "ql": 1, "mask": 2, "arg": 4},
        {"ctx": 9, "ql": 1, "mask": 1, "arg": 20},
    ],
    "after eviction": [{"ctx": 14, "ql": 5, "first": 8, "mask": 1, "arg": 14}, {"ctx": 10, "ql": 1, "first": 4}],
    "flow suffixes of 3 robots": [{"ctx": 40 + 6, "ql": 6, "mask": 1, "arg": 40} for _ in range(3)],
}


def check_attention(device: str, dtype: torch.dtype) -> dict:
    from mstar.engine.attention.metadata import MaskKind
    from mstar.engine.attention.select import select_attention_backend
    from mstar.engine.kv_cache import KVSpec, PagedKVCache
    from support.attention_cases import run_case

    probe = PagedKVCache(KVSpec(1, 2, 64), 4, 16, dtype=dtype, device=device)
    backend_cls = type(select_attention_backend(probe))
    tolerance = 2e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-5
    out = {"backend": backend_cls.name, "dtype": str(dtype), "tolerance": tolerance, "cases": {}}
    for name, specs in ATTENTION_CASES.items():
        specs = [{**s, "mask": MaskKind(s.get("mask", 0))} for s in specs]
        for hq, hkv, d in ((8, 2, 64), (4, 4, 64)):  # one head_dim: each is a kernel FlashInfer compiles there
            got, ref = run_case(
                specs, hq=hq, hkv=hkv, d=d, dtype=dtype, num_blocks=64, backend_cls=backend_cls, device=device
            )
            err = float((got.double() - ref).abs().max())
            out["cases"][f"{name} (Hq {hq}, Hkv {hkv}, D {d})"] = err
    out["max_error"] = max(out["cases"].values())
    out["ok"] = attention_ok(device, backend_cls.name, out["max_error"], tolerance)
    return out


def attention_ok(device: str, backend: str, max_error: float, tolerance: float) -> bool:
    """Within tolerance, and on CUDA through FlashInfer: a silent torch fallback there is a failure."""
    return max_error <= tolerance and (not device.startswith("cuda") or backend == "flashinfer")


async def _serve(graph, modules, requests, device: str, dtype: str) -> list[dict]:
    from mstar.conductor import Conductor
    from mstar.engine.config import EngineConfig

    async with Conductor(graph, modules, config=EngineConfig(dtype=dtype), device=device) as conductor:
        return list(await asyncio.gather(*(conductor.submit(r).collect() for r in requests())))


def check_orpheus(device: str, dtype: str, preset: str) -> dict:
    from mstar.sampling_params import SamplingParams
    from mstar_graphs.orpheus.frontend import OrpheusTTS

    texts = ["Hello there.", "The quick brown fox jumps over the lazy dog."]

    def requests(tts):
        return lambda: [
            tts.request(t, sampling=SamplingParams(max_tokens=48, seed=i), request_id=f"r{i}")
            for i, t in enumerate(texts)
        ]

    ref_tts = OrpheusTTS.load(preset=preset, progress=False)
    reference = asyncio.run(_serve(ref_tts.graph(), ref_tts.modules(), requests(ref_tts), "cpu", "float32"))
    tts = OrpheusTTS.load(preset=preset, progress=False)  # its own modules: the engines move them to the device
    start = time.perf_counter()
    served = asyncio.run(_serve(tts.graph(), tts.modules(), requests(tts), device, dtype))
    out = {"seconds": round(time.perf_counter() - start, 2), "requests": []}
    ok = True
    for got, ref in zip(served, reference):
        a, b = [int(t) for t in got["tokens"]], [int(t) for t in ref["tokens"]]
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        audio = torch.cat([c.float().cpu() for c in got.get("audio", [])]) if got.get("audio") else torch.zeros(0)
        finite = bool(torch.isfinite(audio).all())
        ok &= audio.numel() > 0 and finite
        out["requests"].append(
            {
                "tokens": len(a),
                "reference_tokens": len(b),
                "identical_prefix": same,
                "audio_samples": audio.numel(),
                "audio_finite": finite,
            }
        )
    out["ok"] = ok
    return out


def check_pi05(device: str, dtype: str, preset: str) -> dict:
    from mstar_graphs.pi05.direct import sample_actions_direct
    from mstar_graphs.pi05.frontend import Pi05Policy

    policy = Pi05Policy.load(preset=preset, progress=False)
    gen = torch.Generator().manual_seed(0)
    observations = [
        (
            torch.randint(0, 256, (2, 224, 224, 3), dtype=torch.uint8, generator=gen),
            torch.rand(8, generator=gen) * 2 - 1,
        )
        for _ in range(3)
    ]

    def requests():
        return [
            policy.request(img, state, "pick up the cup", seed=i, request_id=f"robot{i}")
            for i, (img, state) in enumerate(observations)
        ]

    references = []  # first, on the CPU in fp32: serving moves the policy's modules to the device
    for request in requests():
        i = request.inputs
        with torch.no_grad():
            references.append(
                sample_actions_direct(
                    policy.model, policy.encoder, i["images"], i["input_ids"], i["embed_mask"], i["noise"]
                )
                .float()
                .cpu()
            )
    start = time.perf_counter()
    served = asyncio.run(_serve(policy.graph(), policy.modules(), requests, device, dtype))
    seconds = round(time.perf_counter() - start, 2)
    errors = []
    for ref, got in zip(references, served):
        actions = got["actions"][-1].float().cpu()
        errors.append(float((actions - ref).abs().max()) if torch.isfinite(actions).all() else float("inf"))
    return {
        "seconds": seconds,
        "max_abs_error": max(errors),
        "per_robot": errors,
        "ok": all(e < float("inf") for e in errors),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument(
        "--preset",
        help="generated checkpoints for the serving checks (default: bench on CUDA, "
        "whose head_dim 64 FlashInfer serves; tiny on CPU)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    cuda = args.device.startswith("cuda")
    dtype = "bfloat16" if cuda else "float32"
    preset = args.preset or ("bench" if cuda else "tiny")
    report: dict = {
        "device": args.device,
        "torch": torch.__version__,
        "preset": preset,
        "gpu": torch.cuda.get_device_name() if cuda else None,
    }
    failed = []
    for name, check in (
        ("attention", lambda: check_attention(args.device, getattr(torch, dtype))),
        ("orpheus", lambda: check_orpheus(args.device, dtype, preset)),
        ("pi05", lambda: check_pi05(args.device, dtype, preset)),
    ):
        try:
            report[name] = check()
        except Exception as exc:  # the script's job is to say what broke, then go on
            logging.exception("%s check raised", name)
            report[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        status = "ok" if report[name]["ok"] else "FAILED"
        print(f"[gpu_check] {name}: {status} {json.dumps(report[name])[:600]}", flush=True)
        if not report[name]["ok"]:
            failed.append(name)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"[gpu_check] {'all checks passed' if not failed else 'FAILED: ' + ', '.join(failed)} on {args.device}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
