"""Our AR engine decoding C greedy streams of the Orpheus LLM, driven with ExecuteNode calls (no Conductor).

Each stream is what the Conductor makes of a decode: a prefill call that samples the first token,
then one engine-resident Loop call fed by it. The Loop calls of all streams run together (the
engine batches them every step); their wall time is what is timed, as llama.cpp's decode steps are
(mstar_ros.bench.llama_cpp_runner). The LLM decodes unconstrained, so both systems compute the
full 156940-way head every step.
"""

from __future__ import annotations

import itertools
import math
import queue
import time
from pathlib import Path

import torch

from mstar.engine.ar_engine import AREngine
from mstar.engine.config import EngineConfig
from mstar.engine.device_loop import run_on_device
from mstar.engine.messages import ExecuteNode, LoopSpec, NodeOutput
from mstar.sampling_params import SamplingParams
from mstar.transport.inprocess import InProcessTensorStore

GREEDY = SamplingParams(temperature=0.0)
BLOCK = 16


def engine_config(
    dtype: str, quantization: str, streams: int, per_stream_tokens: int, compile: bool | str = False
) -> EngineConfig:
    """A KV pool just big enough for the streams, the linears quantized as ``quantization`` says, the
    forward compiled as ``compile`` says (an engine config's ``compile``)."""
    blocks = streams * math.ceil(per_stream_tokens / BLOCK) + 2
    return EngineConfig(
        dtype=dtype,
        block_size=BLOCK,
        num_kv_blocks=blocks,
        max_num_seqs=max(8, streams),
        quantization=quantization,
        compile=compile,
    )


class OursDecoder:
    """The Orpheus LLM of ``llm_dir`` on an AREngine of its own, stepping on the device thread."""

    def __init__(self, llm_dir: str | Path, config: EngineConfig) -> None:
        from mstar_graphs.orpheus.frontend import OrpheusLLM

        concrete, self.dtype_choice = config.for_device("cpu")
        load_dtype = getattr(torch, concrete.dtype)
        module = run_on_device(OrpheusLLM.from_pretrained_dir, llm_dir, load_dtype, progress=False)
        run_on_device(module.fuse_projections)
        module.constrain = False  # the whole vocabulary, as llama.cpp computes it
        self.store = InProcessTensorStore()
        self.engine = run_on_device(AREngine, module, ["llm"], self.store, config)
        self.engine.start()
        self._ids = itertools.count()

    @property
    def compiled(self) -> bool:
        """Whether the engine's forward runs compiled (``compile: auto`` runs eager where it cannot)."""
        return bool(self.engine.core.stats()["forward_compiled"])

    def close(self) -> None:
        self.engine.stop()

    def _call(self, request_id: str, ids: list[int], loop: LoopSpec | None) -> queue.Queue[NodeOutput]:
        replies: queue.Queue[NodeOutput] = queue.Queue()
        tensor = self.store.put(torch.tensor(ids, dtype=torch.long), owner=request_id)
        msg = ExecuteNode(
            call_id=next(self._ids),
            request_id=request_id,
            node="llm",
            inputs={"input_ids": tensor},
            sampling=GREEDY,
            loop=loop,
        )
        self.engine.submit(msg, replies.put)
        return replies

    def _tokens(self, replies: queue.Queue[NodeOutput], timeout: float = 600.0) -> list[int]:
        tokens = []
        while True:
            out = replies.get(timeout=timeout)
            if out.error is not None:
                raise RuntimeError(f"our engine failed: {out.error}")
            if "token" in out.outputs:
                tokens.append(int(self.store.get(out.outputs["token"])))
            if out.final:
                return tokens

    def greedy(self, prompts: list[list[int]], new_tokens: int) -> tuple[list[list[int]], float]:
        """Each prompt's ``new_tokens`` greedy tokens, and the seconds of the Loop calls after the
        first token (``(new_tokens - 1) * len(prompts)`` tokens), as LlamaCppDecoder.greedy."""
        run = next(self._ids)
        names = [f"decode-{run}-{s}" for s in range(len(prompts))]
        try:
            firsts = [self._call(name, prompt, None) for name, prompt in zip(names, prompts)]
            out = [self._tokens(q) for q in firsts]
            start = time.perf_counter()
            loops = [self._call(name, toks[-1:], LoopSpec(max_iters=new_tokens - 1)) for name, toks in zip(names, out)]
            for toks, q in zip(out, loops):
                toks += self._tokens(q)
            elapsed = time.perf_counter() - start
        finally:  # a failed run must not keep its sequences' KV blocks from the next
            for name in names:
                self.engine.release(name)
        return out, elapsed
