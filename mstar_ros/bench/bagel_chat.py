"""Image to text in the BAGEL bench: ours at each concurrency vs the reference's chat loop one at a time.

Ours: C requests (each its own picture and question) submitted at once, ``chat_rounds`` rounds at C = 1;
time to first token is the first ``text_ids`` output, throughput all tokens over the level's wall time.
The reference serves one request after another (the inferencer's ``chat``: one request, returned whole):
its requests are timed half before ours and half after, and its figures at C derived from the median
request: request k of C waits for the k - 1 before it (``ttft_ms_as_served``: when it returns the
answer; ``ttft_ms_if_streamed``: when its loop has the first token).

``throughput_bound``: what batching can gain at most here, from the reference's prefill and per-token
decode times and our decode step of all C requests (measured once every prefill is done).
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
    ttft, tokens, first_answer, gaps = [], 0, [], []
    start = time.perf_counter()
    for r in range(rounds):

        async def one(i: int) -> tuple[list[int], list[float]]:
            job = chat_job(run.bagel, run.side, index + i, run.opts.answer_tokens, run.rid("chat"))
            t0 = time.perf_counter()
            got: list[int] = []
            stamps: list[float] = []
            async for out in run.conductor.submit(job.request):
                if out.name == "text_ids":
                    stamps.append(time.perf_counter())
                    if not got:
                        ttft.append((stamps[0] - t0) * 1000)
                    got.append(int(out.data))
            return got, stamps

        answers = await asyncio.gather(*(one(i) for i in range(c)))
        tokens += sum(len(a) for a, _ in answers)
        gaps += _decode_gaps([stamps for _, stamps in answers])
        if r == 0:
            first_answer = answers[0][0]
        run.bar.update(1)
    wall = time.perf_counter() - start
    return {
        "requests": c * rounds,
        "ttft_ms": {"p50": statistics.median(ttft), "max": max(ttft)},
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        # between tokens once every request of the round has its first one: a decode step of all C
        "decode_step_ms": statistics.median(gaps) * 1000 if gaps else None,
    }, first_answer


def _decode_gaps(stamps: list[list[float]]) -> list[float]:
    """Time between consecutive tokens of a request, after the last request's first token (no prefill runs
    any more: these are pure decode steps of every request still answering)."""
    prefilled = max(s[0] for s in stamps if s)
    return [b - a for s in stamps for a, b in zip(s, s[1:]) if a >= prefilled]


def throughput_bound(c: int, prefill_s: float, decode_1_s: float, decode_c_s: float, tokens: float) -> float:
    """What batching C requests can gain at most when each prefill costs the same in both systems (a CPU
    prefill is compute-bound: batching it gains nothing) and every decode step runs all C requests at
    ``decode_c_s``: ``C * (prefill + K * decode_1) / (C * prefill + K * decode_C)``."""
    return c * (prefill_s + tokens * decode_1_s) / (c * prefill_s + tokens * decode_c_s)


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
    decode_1 = statistics.median((r.seconds - r.first_token_s) / max(1, len(r.tokens) - 1) for r in baseline)
    for c, level in levels.items():
        if level["decode_step_ms"] is not None:
            level["throughput_bound"] = throughput_bound(
                int(c), first, decode_1, level["decode_step_ms"] / 1000, tokens
            )
    same = sum(a == b for a, b in zip(ours_tokens, ref_tokens))
    return {
        "answer_tokens": opts.answer_tokens,
        "reference_per_request_s": per_request,
        "reference_first_token_s": first,
        "reference_decode_ms_per_token": decode_1 * 1000,
        "reference_tokens_per_request": tokens,
        "reference_runs_s": [r.seconds for r in baseline],
        "first_answer_tokens_equal": f"{same}/{max(len(ours_tokens), len(ref_tokens))}",
        "levels": levels,
    }
