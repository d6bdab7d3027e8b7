"""What bounds the BAGEL bench's image speedups, measured in the same run on the same modules.

- :func:`measure_bound`: one flow forward over the branches' rows together (what our engine step runs:
  3 branches for an edit, 2 for text to image) against the reference's batch-1 forwards, one per
  context, on the baseline's own contexts. Over a schedule with ``g`` guided and ``u`` unguided
  evaluations (an unguided one is a single forward in both systems) the bound is
  ``(g * separate + u * one) / (g * together + u * one)``: what a runtime without any overhead of its
  own would gain by batching the branches (and, for text to image, by not computing the no-image
  branch, which equals the full one).
- :func:`gemm_probe`: the module's own MLP projection at a decode step's rows (1, 8), one branch's flow
  rows and three branches' rows: where a CPU GEMM stops gaining from more rows, batching branches
  gains nothing more.
"""

from __future__ import annotations

import statistics
import time

import torch

from mstar_ros.bench.bagel_workload import ImageJob

BRANCHES = ("gen", "cfg_text", "cfg_img")


def schedule_counts(gen_params: torch.Tensor) -> tuple[int, int]:
    """(guided, unguided) flow evaluations of a request's schedule."""
    from mstar_graphs.bagel.generation_params import GenerationParams
    from mstar_graphs.bagel.guidance import branches_active, timesteps

    g = GenerationParams.unpack(gen_params).guidance
    times = timesteps(g.steps, g.timestep_shift).tolist()[:-1]
    guided = sum(branches_active(g, t)[0] for t in times)
    return guided, len(times) - guided


def bound(guided: int, unguided: int, one: float, separate: float, together: float) -> float:
    return (guided * separate + unguided * one) / (guided * together + unguided * one)


def measure_bound(reference, edit: ImageJob, t2i: ImageJob, repeats: int) -> dict:
    """Per task: one context's forward, each context's alone (and their sum), the branches together
    (medians of ``repeats``); call on the device thread."""
    from mstar_ros.bench.bagel_contexts import flow_velocities

    def timed(contexts, job: ImageJob) -> float:
        inputs = {"gen_params": job.gen_params}
        plan = reference.llm.flow_plan(inputs)
        start = time.perf_counter()
        flow_velocities(reference.pool, contexts, job.noise.float(), float(plan.timesteps[0]), inputs, plan, 0)
        return time.perf_counter() - start

    out: dict = {}
    with torch.inference_mode():
        for task, job, ours in (("edit", edit, 3), ("t2i", t2i, 2)):
            if task == "edit":
                inputs = job.request.inputs
                contexts = reference.edit_contexts(inputs["vae_image"], inputs["vit_image"], job.turn)
            else:
                contexts = reference.t2i_contexts(job.turn)
            order = [contexts[name] for name in BRANCHES]
            rows = {name: c.length for name, c in zip(BRANCHES, order)}  # before the flow rows are added
            try:
                timed(order[:ours], job)  # warm: this batch's shapes may be new
                alone: dict[str, list[float]] = {name: [] for name in BRANCHES}
                together = []
                for _ in range(repeats):
                    for name, context in zip(BRANCHES, order):
                        alone[name].append(timed([context], job))
                    together.append(timed(order[:ours], job))
            finally:
                reference.free(contexts)
            guided, unguided = schedule_counts(job.gen_params)
            each = {name: statistics.median(ts) for name, ts in alone.items()}
            separate, tog = sum(each.values()), statistics.median(together)
            out[task] = {
                "one_context_ms": each["gen"] * 1000,
                "separate_ms": {name: v * 1000 for name, v in each.items()},
                "three_separate_ms": separate * 1000,
                "together_ms": tog * 1000,
                "branches_together": ours,
                "context_rows": rows,
                "guided_steps": guided,
                "unguided_steps": unguided,
                "bound": bound(guided, unguided, each["gen"], separate, tog),
            }
    out["flow_rows"] = int(edit.noise.shape[0]) + 2
    return out


def gemm_probe(llm, flow_rows: int, repeats: int = 3) -> list[dict]:
    """Layer 0's MLP gate projection (hidden -> intermediate, as the engines run it: packed bf16 or plain
    float32) at 1, 8, one branch's and three branches' flow rows: ms and GFLOP/s (device thread)."""
    mlp = llm.model.layers[0].mlp
    linear = mlp.gate_proj if hasattr(mlp, "gate_proj") else mlp.gate_up_proj  # fused or not
    hidden, inner = llm.hidden_size, linear.out_features
    rows_list = [1, 8, flow_rows, 3 * flow_rows]
    out = []
    with torch.inference_mode():
        for rows in rows_list:
            x = torch.randn(rows, hidden).to(llm.dtype)
            linear(x)  # warm: oneDNN makes its kernel for this shape
            calls = max(1, min(50, 4000 // rows))
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                for _ in range(calls):
                    linear(x)
                times.append((time.perf_counter() - start) / calls)
            seconds = min(times)  # the least disturbed (the machine may be shared)
            out.append({"rows": rows, "ms": seconds * 1000, "gflops": 2 * rows * hidden * inner / seconds / 1e9})
    return out
