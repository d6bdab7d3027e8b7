"""An AREngine driven on the test thread: messages handled and steps taken in a fixed order (no device
thread), so a test can preempt, fork and count module calls between steps."""

from __future__ import annotations

import itertools

import torch

from mstar.engine.ar_engine import AREngine
from mstar.engine.config import EngineConfig
from mstar.engine.messages import ExecuteNode, LoopSpec, NodeOutput
from mstar.graph.loop_mode import LoopMode
from mstar.sampling_params import SamplingParams
from mstar.transport.inprocess import InProcessTensorStore


class EngineStepper:
    def __init__(self, module, views, **cfg) -> None:
        self.store = InProcessTensorStore()
        config = EngineConfig(**{"num_kv_blocks": 64, "block_size": 4, "dtype": "float32", **cfg})
        self.engine = AREngine(module, list(views), self.store, config)
        self.ids = itertools.count()

    @property
    def core(self):
        return self.engine.core

    def call(
        self,
        node: str,
        request_id: str,
        inputs: dict,
        *,
        session_id: str | None = None,
        kv_from: str | None = None,
        guidance: tuple[str, ...] = (),
        loop_mode: LoopMode = LoopMode.TOKEN,
        loop: LoopSpec | None = None,
        sampling: SamplingParams | None = None,
        seed: int = 0,
        kv_import=None,
    ) -> list[NodeOutput]:
        """Hands the call to the engine; its replies collect in the returned list."""
        replies: list[NodeOutput] = []
        refs = {name: self.store.put(torch.as_tensor(value), owner=request_id) for name, value in inputs.items()}
        msg = ExecuteNode(
            call_id=next(self.ids),
            request_id=request_id,
            node=node,
            inputs=refs,
            seed=seed,
            session_id=session_id,
            kv_from=kv_from,
            guidance=guidance,
            loop_mode=loop_mode,
            loop=loop,
            sampling=sampling,
            kv_import=kv_import,
        )
        self.engine._handle(msg, replies.append)
        return replies

    def drain(self, max_steps: int = 1000) -> int:
        """Steps until no loop has work; returns the steps taken."""
        steps = 0
        while self.engine.has_work():
            self.engine.step()
            steps += 1
            assert steps < max_steps, f"no end after {max_steps} steps: {self.engine.stats()}"
        return steps

    def output(self, replies: list[NodeOutput], name: str) -> torch.Tensor:
        """Output ``name`` of a call's final reply (which must not be an error)."""
        assert replies and replies[-1].final, replies
        assert replies[-1].error is None, replies[-1].error
        return self.store.get(replies[-1].outputs[name])

    def seq(self, owner: str, node: str):
        return self.engine.scheduler.seqs[(owner, node)]
