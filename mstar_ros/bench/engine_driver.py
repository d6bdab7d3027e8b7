"""The AR engine stepped on the calling thread, one request at a time, each step timed (benchmarks)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from mstar.engine.ar_engine import AREngine
from mstar.engine.config import EngineConfig
from mstar.engine.messages import ExecuteNode, LoopSpec, NodeOutput, ReleaseRequest
from mstar.sampling_params import SamplingParams
from mstar.transport.inprocess import InProcessTensorStore
from mstar_ros.bench.bare_forward import sync


class EngineDriver:
    """The AR engine stepped on the calling thread, one request at a time."""

    def __init__(self, module: torch.nn.Module, config: EngineConfig, device: str = "cpu") -> None:
        self.store = InProcessTensorStore()
        self.engine = AREngine(module, ["llm"], self.store, config, device=device)
        self.replies: list[NodeOutput] = []
        self.calls = 0

    def begin(self, prompt: list[int], iterations: int, sampling: SamplingParams) -> None:
        """Submits a request decoding ``iterations`` tokens after ``prompt`` and runs its prefill."""
        self.calls += 1
        request_id = f"r{self.calls}"
        msg = ExecuteNode(
            call_id=self.calls,
            request_id=request_id,
            node="llm",
            inputs={"input_ids": self.store.put(torch.tensor(prompt, dtype=torch.long), owner=request_id)},
            seed=self.calls,
            sampling=sampling,
            loop=LoopSpec(max_iters=iterations),
        )
        self.engine.submit(msg, self.replies.append)
        self.engine.poll()
        self.engine.step()

    def step(self) -> tuple[float, float]:
        """One engine step: (wall, this thread's CPU) seconds."""
        wall, cpu = time.perf_counter(), time.thread_time()
        self.engine.step()
        sync(self.engine.core.device)
        return time.perf_counter() - wall, time.thread_time() - cpu

    def end(self) -> None:
        """Checks the request finished cleanly and lets it go."""
        final = self.replies[-1]
        if not final.final or final.error:
            raise RuntimeError(f"the engine's decode did not finish cleanly: {final}")
        self.engine._post(ReleaseRequest(f"r{self.calls}"))
        self.engine.poll()
        self.replies.clear()

    def decode(
        self,
        prompt: list[int],
        warmup: int,
        steps: int,
        sampling: SamplingParams,
        before_timed: Callable[[], None] | None = None,
    ) -> list[tuple[float, float]]:
        """Prefills ``prompt`` (untimed), then returns (wall, CPU) seconds of each of ``steps`` decode steps.
        ``before_timed``: called once the prefill and warm-up steps are done (a profiler's reset)."""
        self.begin(prompt, 1 + warmup + steps, sampling)
        for _ in range(warmup):
            self.step()
        if before_timed is not None:
            before_timed()
        times = [self.step() for _ in range(steps)]
        self.end()
        return times
