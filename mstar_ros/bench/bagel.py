"""``mstar-ros bench bagel``: BAGEL served by the Conductor vs ByteDance's inferencer algorithm, same run.

Both systems run the same module objects (the served engines cast and pack them; the baseline calls
them afterwards), the same attention kernels and the same guidance code, on the device thread. The
baseline (mstar_ros.bench.bagel_baseline) is the reference's scheduling: one KV cache per context,
batch-1 calls, the three guidance contexts evaluated one after another at every flow step, one chat
request at a time. Ours: the three views of one request evaluated in ONE engine step; chat requests
batched.

- **editing** and **text to image** at one request: the latency from the built request to the decoded
  image (encoders, context prefills, every flow step, the VAE decoder), runs interleaved, medians;
  ``speedup_edit`` / ``speedup_t2i``. The final latents of both are compared (``latent_rel_diff``).
- **the bound**, measured on the baseline's own contexts: the time of one flow forward over the
  branches' rows together (what our engine step runs) against the reference's separate batch-1
  forwards, weighted by the schedule's guided and unguided steps. A runtime can at best remove the
  difference between the two, so ``fraction_of_bound`` = speedup / bound says how much of it the served
  path keeps. (Text to image: we evaluate two branches together, the reference three one by one: its
  no-image context equals the full one, and we do not compute that velocity twice.)
- **image to text** at concurrency 1 and 8: time to first token and tokens per second. The reference
  answers one request after another, so its figures at C are derived from its per-request times
  (request k waits for the k - 1 before it); ``ttft_ratio_c1`` compares with the moment its loop has
  the first token (what a streaming version could send), ``ttft_ratio_c1_as_served`` with when it
  returns the answer (the inferencer returns text only at the end).

Bench preset (mstar_graphs.bagel.tiny, ``bench``): the release's proportions at a quarter of its width
(head_dim 128, 7 query heads per KV head, MLP 37/7 of the width, 4 layers, a 4096-token vocabulary)
and half its image side (512 px: 1024 latent tokens, 1225 ViT rows), so one run of the whole bench
stays within a few minutes on a 2-core CPU while image rows dominate as in the release. Random weights.
Defaults: 8 flow points (7 evaluations, one of text to image's unguided, as 8 of the release's 49),
two interleaved runs per image task, 512-token answers (the reference app's ``max_new_tokens`` for
understanding). On random weights neither system stops at ``<|im_end|>`` (ours serves the graph without
a stop token, the reference's loop gets none): every answer runs to its length in both, so tokens per
second compare like for like. Ours' ``max_batched_tokens`` is sized so an image question's prefill fits
beside running decodes (:func:`prompt_budget`), as the figures so far were measured.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from mstar.progress import progress_bar
from mstar_ros.bench.bagel_bound import gemm_probe, measure_bound
from mstar_ros.bench.bagel_chat import measure_chat
from mstar_ros.bench.bagel_workload import ImageJob, chat_job, edit_job, t2i_job

GOALS = {
    "speedup_edit": 2.0,
    "speedup_t2i": 1.5,
    "fraction_of_bound": 0.8,
    "ttft_ratio_c1": 0.7,
    "throughput_ratio_c8": 3.0,
}


@dataclass
class BagelBenchOptions:
    preset: str = "bench"
    weights: str | None = None
    image_size: int | None = None  # pixels per side; None: the model's largest (512 for the bench preset)
    steps: int = 8  # schedule points (steps - 1 flow evaluations; the release's default is 50)
    repeats: int = 2  # interleaved runs of each system per image task
    bound_repeats: int = 2
    answer_tokens: int = 512  # the reference app's max_new_tokens for understanding
    concurrency: list[int] = field(default_factory=lambda: [1, 8])
    chat_rounds: int = 2  # sequential requests timed at concurrency 1
    baseline_chats: int = 3  # the reference's chat requests, timed around ours
    max_batched_tokens: int | None = None  # ours; None: room for an image prompt beside running decodes
    dtype: str = "auto"
    seed: int = 0


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


@dataclass
class BenchRun:
    """The loaded model, its Conductor and the baseline, for every part of one run (request ids unique)."""

    bagel: Any
    conductor: Any
    reference: Any  # mstar_ros.bench.bagel_baseline.ReferenceBagel
    opts: BagelBenchOptions
    side: int  # image side in pixels
    bar: Any
    _ids: int = 0

    def rid(self, kind: str) -> str:
        self._ids += 1
        return f"bench-{kind}-{self._ids}"

    def image_job(self, task: str, steps: int | None = None) -> ImageJob:
        make = edit_job if task == "edit" else t2i_job
        return make(self.bagel, self.side, steps or self.opts.steps, self.opts.seed, self.rid(task))

    async def ours_image(self, job: ImageJob) -> tuple[float, torch.Tensor, torch.Tensor]:
        start = time.perf_counter()
        latent = image = None
        async for out in self.conductor.submit(job.request):
            if out.name == "latent":
                latent = out.data
            elif out.name == "image":
                image = out.data
        if latent is None or image is None:
            raise RuntimeError(f"request {job.request.request_id} ended without its image")
        return time.perf_counter() - start, latent, image

    def reference_image(self, task: str, job: ImageJob):
        from mstar.engine.device_loop import run_on_device

        ref, inputs = self.reference, job.request.inputs
        if task == "edit":
            return run_on_device(
                ref.edit, inputs["vae_image"], inputs["vit_image"], job.turn, job.noise, job.gen_params
            )
        return run_on_device(ref.text_to_image, job.turn, job.noise, job.gen_params)


async def _image_task(run: BenchRun, task: str) -> dict:
    ours, reference, diffs, image_diffs, forwards = [], [], [], [], 0
    for r in range(run.opts.repeats):  # interleaved, in turn first: both systems see the same machine load
        job = run.image_job(task)
        result = run.reference_image(task, job) if r % 2 else None
        seconds, latent, image = await run.ours_image(job)
        ours.append(seconds)
        result = result or run.reference_image(task, job)
        reference.append(result.seconds)
        forwards = result.forwards
        diffs.append(_rel(latent, result.latent))
        image_diffs.append(int((image.int() - result.image.int()).abs().max()))
        run.bar.update(1)
    return {
        "ours_s": _median(ours),
        "reference_s": _median(reference),
        "speedup": _median(reference) / _median(ours),
        "ours_runs_s": ours,
        "reference_runs_s": reference,
        "reference_flow_forwards": forwards,
        "latent_rel_diff": max(diffs),
        "image_max_abs_diff": max(image_diffs),
    }


async def _warm(run: BenchRun) -> None:
    """Both systems once at every shape the timed runs use (oneDNN makes its kernels per shape)."""
    for task in ("edit", "t2i"):
        job = run.image_job(task, steps=2)
        await run.ours_image(job)
        run.reference_image(task, job)
    job = chat_job(run.bagel, run.side, 0, 2, run.rid("warm"))
    await run.conductor.submit(job.request).collect()
    from mstar.engine.device_loop import run_on_device

    run_on_device(run.reference.chat, job.vit_image, job.turn, 2)
    run.bar.update(1)


def prompt_budget(bagel, side: int) -> int:
    """Ours' ``max_batched_tokens``: the engine default (1024), or more so that an image question's prefill
    (its ViT span cannot be split over steps) fits in a step beside the running decodes. With less, the
    scheduler runs such a span only in a step of its own, i.e. after every older request has finished
    decoding: image questions would be served one after another."""
    job = chat_job(bagel, side, 0, 2, "budget")
    rows = int(job.request.inputs["ids"].numel()) + 64  # + a decode token of every request
    return max(1024, -(-rows // 1024) * 1024)


def _kv_rows(bagel, side: int) -> int:
    """KV slots the baseline needs at most at once (an edit's three contexts and their flow rows)."""
    job = edit_job(bagel, side, 2, 0, "size")
    views = job.full_context_rows + sum(int(job.request.inputs[k].numel()) for k in ("cfg_text_ids", "cfg_img_ids"))
    return 2 * (views + 3 * (int(job.noise.shape[0]) + 2)) + 4096  # the bound holds an edit's and a t2i's at once


async def _measure(bagel, opts: BagelBenchOptions, side: int, bar) -> dict:
    from mstar.conductor import Conductor
    from mstar.engine.config import EngineConfig
    from mstar.engine.device_loop import run_on_device
    from mstar_ros.bench.bagel_baseline import ReferenceBagel

    special = bagel.tokenizer.special
    config = EngineConfig(dtype=opts.dtype, max_batched_tokens=opts.max_batched_tokens or prompt_budget(bagel, side))
    stops = not bagel.random_weights  # random weights: answers run to their length in both systems
    async with Conductor(bagel.graph(stop_at_im_end=stops), bagel.modules(), config=config) as conductor:
        # after the engines cast and packed the modules: the baseline calls the very same objects
        reference = ReferenceBagel(
            bagel.modules(),
            bagel.requests.markers,
            special.im_start,
            special.im_end if stops else None,
            _kv_rows(bagel, side),
        )
        run = BenchRun(bagel, conductor, reference, opts, side, bar)
        await _warm(run)
        edit = await _image_task(run, "edit")
        t2i = await _image_task(run, "t2i")
        bound = run_on_device(measure_bound, reference, run.image_job("edit"), run.image_job("t2i"), opts.bound_repeats)
        bound["gemm"] = run_on_device(gemm_probe, reference.llm, bound["flow_rows"])
        bar.update(1)
        chat = await measure_chat(run)
        dtype = str(reference.llm.dtype).removeprefix("torch.")
    return {
        "edit": edit,
        "t2i": t2i,
        "bound": bound,
        "chat": chat,
        "dtype": dtype,
        "max_batched_tokens": config.max_batched_tokens,
    }


def _model_section(bagel, opts: BagelBenchOptions, side: int) -> dict:
    from mstar_graphs.bagel.vit_config import VitConfig

    c = bagel.config.llm
    vit = VitConfig.from_dir(bagel.path)
    job = edit_job(bagel, side, 2, 0, "shape")
    return {
        "preset": opts.preset if opts.weights is None else None,
        "weights": str(bagel.path),
        "random_weights": bagel.random_weights,
        "llm": {
            "hidden": c.hidden_size,
            "layers": c.num_hidden_layers,
            "heads": c.num_attention_heads,
            "kv_heads": c.num_key_value_heads,
            "head_dim": c.head_dim,
            "intermediate": c.intermediate_size,
            "vocab": c.vocab_size,
        },
        "vit": {"hidden": vit.hidden_size, "layers": vit.num_hidden_layers, "heads": vit.num_attention_heads},
        "image_side": side,
        "latent_tokens": int(job.noise.shape[0]),
        "vit_rows": bagel.requests.vit_rows(bagel.requests.prepare_image(_first_picture(side))),
        "edit_context_rows": job.full_context_rows,
        "edit_prompt_rows": len(job.turn),
    }


def _first_picture(side: int):
    from mstar_ros.bench.bagel_workload import picture

    return picture(side)


def run_bagel_bench(opts: BagelBenchOptions) -> dict:
    from mstar.engine.dtype_choice import resolve_dtype
    from mstar.engine.intra_op import model_threads
    from mstar_graphs.bagel.frontend import BagelModel
    from mstar_ros.bench.machine import dtypes_section, machine_section

    choice = resolve_dtype(opts.dtype)
    bagel = BagelModel.load(opts.weights, preset=opts.preset, progress=True)
    largest = bagel.config.dims.max_latent_size * bagel.requests.downsample
    side = opts.image_size or largest
    bagel.requests.check_size(side, side, "--image-size")
    check_options(opts)
    chat_rounds = sum(opts.chat_rounds if c == 1 else 1 for c in opts.concurrency)
    total = 1 + 2 * opts.repeats + 1 + opts.baseline_chats + chat_rounds
    with progress_bar(total=total, desc="bench bagel", unit="run") as bar:
        measured = asyncio.run(_measure(bagel, opts, side, bar))
    edit, t2i, bound, chat = measured["edit"], measured["t2i"], measured["bound"], measured["chat"]
    for task, row in (("edit", edit), ("t2i", t2i)):
        row["bound"] = bound[task]["bound"]
        row["fraction_of_bound"] = row["speedup"] / row["bound"]
    lo, hi = str(min(opts.concurrency)), str(max(opts.concurrency))
    report = {
        "model": _model_section(bagel, opts, side),
        "options": {
            "steps": opts.steps,
            "repeats": opts.repeats,
            "bound_repeats": opts.bound_repeats,
            "answer_tokens": opts.answer_tokens,
            "concurrency": opts.concurrency,
            "chat_rounds": opts.chat_rounds,
            "baseline_chats": opts.baseline_chats,
        },
        "threads": model_threads(),
        "machine": machine_section(),
        "max_batched_tokens": measured["max_batched_tokens"],
        "dtypes": dtypes_section(choice, measured["dtype"], "the same module objects as ours (the engines' cast)"),
        "edit": edit,
        "t2i": t2i,
        "bound": bound,
        "chat": chat,
        "speedup_edit": edit["speedup"],
        "speedup_t2i": t2i["speedup"],
        "fraction_of_bound_edit": edit["fraction_of_bound"],
        "fraction_of_bound_t2i": t2i["fraction_of_bound"],
        f"ttft_ratio_c{lo}": chat["levels"][lo]["ttft_ratio"],
        f"ttft_ratio_c{lo}_as_served": chat["levels"][lo]["ttft_ms"]["p50"]
        / chat["levels"][lo]["reference"]["ttft_ms_as_served"]["p50"],
        f"throughput_ratio_c{hi}": chat["levels"][hi]["throughput_ratio"],
        "goals": GOALS,
    }
    report["goals_met"] = goals_met(report, lo, hi)
    return report


def check_options(opts: BagelBenchOptions) -> None:
    """ValueError naming the option that cannot run."""
    for name, least in (
        ("steps", 3),
        ("repeats", 1),
        ("bound_repeats", 1),
        ("answer_tokens", 2),
        ("chat_rounds", 1),
        ("baseline_chats", 1),
    ):
        if getattr(opts, name) < least:
            raise ValueError(f"--{name.replace('_', '-')} must be >= {least}, got {getattr(opts, name)}")
    if not opts.concurrency or min(opts.concurrency) < 1:
        raise ValueError(f"--concurrency needs levels >= 1, got {opts.concurrency}")


def goals_met(report: dict, lo: str, hi: str) -> dict[str, bool]:
    g = GOALS
    return {
        "speedup_edit": report["speedup_edit"] >= g["speedup_edit"],
        "speedup_t2i": report["speedup_t2i"] >= g["speedup_t2i"],
        "fraction_of_bound_edit": report["fraction_of_bound_edit"] >= g["fraction_of_bound"],
        "fraction_of_bound_t2i": report["fraction_of_bound_t2i"] >= g["fraction_of_bound"],
        f"ttft_ratio_c{lo}": report[f"ttft_ratio_c{lo}"] <= g["ttft_ratio_c1"],
        f"throughput_ratio_c{hi}": report[f"throughput_ratio_c{hi}"] >= g["throughput_ratio_c8"],
    }
