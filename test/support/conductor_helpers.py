"""Helpers shared by the Conductor tests: a toy LM, its cached dense reference, small request builders."""

from __future__ import annotations

import asyncio
import functools

import torch

from mstar.conductor import Conductor, Request
from mstar.engine.config import EngineConfig
from mstar.sampling_params import SamplingParams
from support.toy_models import ToyLM

__all__ = [
    "BS",
    "LENGTHS",
    "LM",
    "MAX_TOKENS",
    "PROMPTS",
    "config",
    "engine_stats",
    "make_prompts",
    "ref",
    "req",
    "run",
    "run_batch",
    "toks",
    "until",
]

BS = 4


def run(coro, timeout: float = 60.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def config(**kw) -> EngineConfig:
    """float32 unless asked: these tests hold the engine's greedy tokens, whatever the batching, to ToyLM's
    dense reference exactly, and in bf16 the rounding of a batched or recomputed step flips near-tied
    tokens (support/parity.py)."""
    return EngineConfig(**{"num_kv_blocks": 256, "block_size": BS, "dtype": "float32", **kw})


def toks(out: dict) -> list[int]:
    return [int(t) for t in out.get("token", [])]


def engine_stats(c: Conductor) -> dict:
    return c.stats()["workers"][0]["ar:llm"]


async def until(pred, timeout: float = 5.0, what: str = "condition"):
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def req(prompt, max_tokens=8, **kw) -> Request:
    sampling = kw.pop("sampling", None) or SamplingParams(max_tokens=max_tokens)
    return Request({"prompt": torch.tensor(prompt, dtype=torch.long)}, sampling, **kw)


LM = ToyLM()


@functools.cache
def ref(prompt: tuple, n: int, stop: int | None = None) -> list[int]:
    return LM.reference_greedy(list(prompt), n, stop)


def make_prompts(lengths, seed=0, vocab=97):
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(0, vocab, (n,), generator=g).tolist()) for n in lengths]


LENGTHS = [1, 3, 40, 7, 12, 2, 33, 25, 5, 18, 9, 40, 27, 14, 4, 21]
MAX_TOKENS = [1, 2, 17, 9, 24, 5, 13, 3, 30, 8, 11, 20, 6, 15, 1, 10]
PROMPTS = make_prompts(LENGTHS)


async def run_batch(c: Conductor, prompts, max_tokens) -> list[list[int]]:
    streams = [c.submit(req(list(p), n)) for p, n in zip(prompts, max_tokens)]
    outs = await asyncio.gather(*(s.collect() for s in streams))
    return [toks(o) for o in outs]
