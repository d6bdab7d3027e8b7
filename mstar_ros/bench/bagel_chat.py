"""Image to text in the BAGEL bench: ours at each concurrency vs the reference's chat loop one at a time.

Ours: C requests (each its own picture and question) submitted at once, ``chat_rounds`` rounds at C = 1;
time to first token is the first ``text_ids`` output, throughput all tokens over the level's wall time.
The reference serves one request after another (the inferencer's ``chat``: one request, returned whole):
its requests are timed half before ours and half after, and its figures at C derived from the median
request: request k of C waits for the k - 1 before it (``ttft_ms_as_served``: when it returns the
answer; ``ttft_ms_if_streamed``: when its loop has the first token).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import TYPE_CHECKING

from mstar_ros.bench.bagel_workload import ChatJob, chat_job

if TYPE_CHECKING:  # bagel.py imports this module
    from mstar_ros.bench.bagel import BenchRun


async def _chat_level(run: BenchRun, c: int, rounds: int, index: int) -> tuple[dict, list[int]]:
    ttft, tokens, first_answer = [], 0, []
    start = time.perf_counter()
    for r in range(rounds):

        async def one(i: int) -> list[int]:
            job = chat_job(run.bagel, run.side, index + i, run.opts.answer_tokens, run.rid("chat"))
            t0 = time.perf_counter()
            got: list[int] = []
            async for out in run.conductor.submit(job.request):
                if out.name == "text_ids":
                    if not got:
                        ttft.append((time.perf_counter() - t0) * 1000)
                    got.append(int(out.data))
            return got

        answers = await asyncio.gather(*(one(i) for i in range(c)))
        tokens += sum(len(a) for a in answers)
        if r == 0:
            first_answer = answers[0]
        run.bar.update(1)
    wall = time.perf_counter() - start
    return {
        "requests": c * rounds,
        "ttft_ms": {"p50": statistics.median(ttft), "max": max(ttft)},
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
    }, first_answer


def _reference_chats(run: BenchRun, n: int, index: int, out: list) -> list[int]:
    from mstar.engine.device_loop import run_on_device

    tokens: list[int] = []
    for i in range(n):
        job: ChatJob = chat_job(run.bagel, run.side, index + i, run.opts.answer_tokens, run.rid("ref-chat"))
        result = run_on_device(run.reference.chat, job.vit_image, job.turn, job.max_tokens)
        out.append(result)
        tokens = tokens or result.tokens
        run.bar.update(1)
    return tokens


async def measure_chat(run: BenchRun) -> dict:
    opts = run.opts
    baseline: list = []
    before = (opts.baseline_chats + 1) // 2
    ref_tokens = _reference_chats(run, before, 0, baseline)
    levels, ours_tokens = {}, []
    for c in opts.concurrency:
        rounds = opts.chat_rounds if c == 1 else 1
        levels[str(c)], answer = await _chat_level(run, c, rounds, 0)
        ours_tokens = ours_tokens or answer
    _reference_chats(run, opts.baseline_chats - before, before, baseline)
    per_request = statistics.median([r.seconds for r in baseline])
    first = statistics.median([r.first_token_s for r in baseline])
    tokens = statistics.mean(len(r.tokens) for r in baseline)
    for c, level in levels.items():
        k = int(c)
        queued_served = [per_request * (i + 1) * 1000 for i in range(k)]
        queued_streamed = [(per_request * i + first) * 1000 for i in range(k)]
        level["reference"] = {
            "ttft_ms_if_streamed": {"p50": statistics.median(queued_streamed), "max": max(queued_streamed)},
            "ttft_ms_as_served": {"p50": statistics.median(queued_served), "max": max(queued_served)},
            "tokens_per_s": tokens / per_request,
        }
        level["throughput_ratio"] = level["tokens_per_s"] / level["reference"]["tokens_per_s"]
        level["ttft_ratio"] = level["ttft_ms"]["p50"] / level["reference"]["ttft_ms_if_streamed"]["p50"]
    same = sum(a == b for a, b in zip(ours_tokens, ref_tokens))
    return {
        "answer_tokens": opts.answer_tokens,
        "reference_per_request_s": per_request,
        "reference_first_token_s": first,
        "reference_tokens_per_request": tokens,
        "reference_runs_s": [r.seconds for r in baseline],
        "first_answer_tokens_equal": f"{same}/{max(len(ours_tokens), len(ref_tokens))}",
        "levels": levels,
    }
