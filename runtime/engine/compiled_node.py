"""A stateless node's forward under ``torch.compile`` (``compile`` in the engine config, CPU only).

Why: a streaming codec's window (Orpheus's SNAC: 4 frames) is dozens of small convolutions, norms and
activations; on CPU their launches cost as much as their arithmetic. Inductor fuses them into a few
generated kernels, weights frozen into the graph as for an AR forward (``mstar.engine.compiled_forward``):
SNAC's four-window batch of the bench preset measured 10.4 -> 6.9 ms.

Which nodes: those whose module names the batches it must be fast for
(``NodeSubmodule.warm_up_batches``: a streaming window, say). The engine compiles them when it is built,
one graph per batch given; a batch of two or more calls is compiled with its batch dimension (dim 0 of
every tensor input) symbolic, so that graph serves every batch size from 2 on. While serving nothing
is compiled: a batch no graph was made for (another window length or crop, a stream's first window)
runs the eager forward (``torch.compiler.set_stance("eager_on_recompile")``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from mstar.engine.compile_support import RECOMPILE_LIMIT, compile_blocker, frozen_and_tuned, graph_count, one_line
from mstar.engine.device_loop import run_on_device
from mstar.graph.node import NodeSubmodule

log = logging.getLogger("mstar.engine")


class CompiledNode:
    """Calls ``module(**batch)`` through the graphs compiled for its warm-up batches, else eagerly."""

    def __init__(self, module: NodeSubmodule, name: str) -> None:
        self.module = module
        self.name = name
        self._compiled = torch.compile(module.forward, fullgraph=True)
        self.graphs = 0
        config = torch._dynamo.config  # frozen graphs are per module instance: room for a few dozen
        config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)

    def warm_up(self, batches: list[dict[str, Any]]) -> float:
        """Compiles a graph for each batch; the seconds it took. Raises ValueError naming the node when
        one cannot be compiled."""
        started = time.perf_counter()
        before = graph_count()
        try:
            with torch.inference_mode(), frozen_and_tuned():
                for batch in batches:
                    tensors = [v for v in batch.values() if isinstance(v, torch.Tensor)]
                    if tensors and tensors[0].shape[0] >= 2:  # any number of calls from 2 on, in one graph
                        for tensor in tensors:
                            torch._dynamo.mark_dynamic(tensor, 0)
                    self._compiled(**batch)
        except Exception as exc:
            raise ValueError(f"{self.name}: compiling the node's forward failed ({one_line(exc)})") from exc
        finally:
            self.graphs += graph_count() - before
        return time.perf_counter() - started

    def __call__(self, **batch: Any) -> Any:
        with torch.compiler.set_stance("eager_on_recompile"):
            return self._compiled(**batch)


def compile_nodes(
    nodes: Mapping[str, NodeSubmodule],
    device: torch.device,
    engine: str,
    compile: bool | str,
    quantization: Callable[[str], str],
) -> dict[str, CompiledNode]:
    """Of ``nodes``, those whose modules name warm-up batches, compiled and warmed up on the device
    thread (views of one module share its graphs). ``compile``: the engine config's (``auto``: where it
    can, else eager and logged; true: ValueError naming the node where it cannot); ``quantization(node)``:
    the node's weight mode."""
    if not compile:
        return {}
    compiled: dict[str, CompiledNode] = {}
    done: dict[int, CompiledNode | None] = {}
    for node, module in nodes.items():
        if id(module) not in done:
            done[id(module)] = _compiled_node(module, device, f"{engine}: node {node!r}", compile, quantization(node))
        if done[id(module)] is not None:
            compiled[node] = done[id(module)]
    return compiled


def _compiled_node(
    module: NodeSubmodule, device: torch.device, name: str, compile: bool | str, quantization: str
) -> CompiledNode | None:
    with torch.inference_mode():  # what serving's batches are (a graph's guards check it)
        batches = module.warm_up_batches()
    if not batches:
        return None
    blocker = compile_blocker(device, 1, quantization)
    if blocker is not None:
        if compile == "auto":
            log.info("%s: forward eager (compile: auto, but %s)", name, blocker)
            return None
        raise ValueError(f"{name}: compile: true, but {blocker}")
    compiled = CompiledNode(module, name)
    try:
        seconds = run_on_device(compiled.warm_up, batches)
    except ValueError as exc:
        if compile != "auto":
            raise
        log.warning("%s: forward eager (compile: auto; %s)", name, str(exc).removeprefix(f"{name}: "))
        return None
    log.info("%s: forward compiled in %.1f s (%d graphs; weights frozen into them)", name, seconds, compiled.graphs)
    return compiled
