"""Graph components: a GraphNode (wiring) and its NodeSubmodule (the computation)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch

from mstar.graph.loop_mode import LoopMode

EngineKind = Literal["ar", "stateless"]


@dataclass(frozen=True)
class NodeCall:
    """One request's invocation of a stateless node, as the engine sees it.

    ``index`` counts this request's calls of the node (0, 1, ...) so a node can
    derive per-call randomness that does not depend on how calls are batched.
    """

    request_id: str
    inputs: Mapping[str, torch.Tensor]
    index: int = 0
    seed: int = 0
    meta: Mapping[str, Any] = field(default_factory=dict)


class NodeSubmodule(torch.nn.Module):
    """The computation behind a node: ``prepare_inputs`` builds a batch, ``forward`` is pure tensors.

    Batching, KV caching, transport and device placement are the runtime's job.
    Stateless nodes use the defaults below (stack each input along a new batch
    dimension, split outputs along dim 0). AR nodes (``engine = "ar"``) are driven
    by the AR engine through the :class:`ARModule` protocol instead.
    """

    engine: ClassVar[EngineKind] = "stateless"
    # Linear submodules whose ``.weight`` the module reads itself: the engine keeps them
    # plain when it packs the others (see mstar.layers.linear_packing).
    plain_linears: ClassVar[tuple[str, ...]] = ()
    # Of those, heads read only through mstar.layers.tensor_parallel.restricted_logits(hidden, head_module,
    # ...): weight-only quantization (mstar.layers.weight_only) may replace them.
    quantizable_heads: ClassVar[tuple[str, ...]] = ()
    # Calls of one request that build on each other (a streaming decoder that keeps its caches between
    # chunks): the engine runs them one at a time per request, in ``NodeCall.index`` order, and calls
    # ``release`` when the request ends, finished, failed or cancelled.
    sequential_calls: ClassVar[bool] = False

    def release(self, request_id: str) -> None:
        """Frees what the module keeps for ``request_id`` between its calls (``sequential_calls``)."""

    def prepare_inputs(self, calls: Sequence[NodeCall]) -> dict[str, torch.Tensor]:
        keys = list(calls[0].inputs)
        batch: dict[str, torch.Tensor] = {}
        for key in keys:
            shapes = {tuple(c.inputs[key].shape) for c in calls}
            if len(shapes) != 1:
                raise ValueError(
                    f"{type(self).__name__}: input {key!r} has different shapes in one batch: {sorted(shapes)}"
                )
            batch[key] = torch.stack([c.inputs[key] for c in calls])
        return batch

    def split_outputs(
        self, outputs: Mapping[str, torch.Tensor], calls: Sequence[NodeCall]
    ) -> list[dict[str, torch.Tensor]]:
        return [{k: v[i] for k, v in outputs.items()} for i in range(len(calls))]

    def batch_key(self, call: NodeCall) -> Any:
        """Calls with equal keys may share a batch (default: equal input shapes)."""
        return tuple((k, tuple(v.shape)) for k, v in sorted(call.inputs.items()))

    def warm_up_batches(self) -> list[dict[str, Any]]:
        """Batches (``prepare_inputs`` results) a compiling engine compiles ``forward`` for, at start
        (mstar.engine.compiled_node); every tensor's dim 0 is the batch. Default: none, never compiled."""
        return []


@dataclass(frozen=True)
class GraphNode:
    """A component of a model graph: a name, named input and output edges, an engine kind.

    ``module`` names the submodule that computes it; several nodes may share one
    module ("views": same weights, separate KV per node name).
    """

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    engine: EngineKind = "stateless"
    module: str | None = None
    kv_from: str | None = None
    # an AR node's Loop (a LoopMode or its string): "token" (default), "flow" (integrates input/output "x" over
    # the KV of ``kv_from``), "frames" (rows come in frames: a world model; mstar.engine.frame_loop) or
    # "velocity" (one flow evaluation over the KV of ``kv_from``: input "x" [and "step"], output "v")
    loop_mode: LoopMode = LoopMode.TOKEN
    optional_inputs: tuple[str, ...] = ()  # ports a call may go without (the engine has a default)
    # ports whose streaming edge feeds the node's running Loop call (its chunks join the call's side input
    # as they come, mstar.engine.fed_inputs) instead of starting a call per chunk
    fed_inputs: tuple[str, ...] = ()
    # a flow node's guidance views (classifier-free guidance): AR views of the same module whose KV each
    # give the flow one more branch, evaluated beside the main one (``kv_from``) in the same engine step
    guidance: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        object.__setattr__(self, "optional_inputs", tuple(self.optional_inputs))
        object.__setattr__(self, "fed_inputs", tuple(self.fed_inputs))
        object.__setattr__(self, "guidance", tuple(self.guidance))
        object.__setattr__(self, "loop_mode", LoopMode.parse(self.loop_mode))
        if any(p not in self.inputs for p in self.fed_inputs) or (self.fed_inputs and self.engine != "ar"):
            raise ValueError(
                f"node {self.name!r}: fed inputs {list(self.fed_inputs)} must be inputs of an AR node "
                f"(inputs: {list(self.inputs)}, engine {self.engine!r})"
            )
        unknown = [p for p in self.optional_inputs if p not in self.inputs]
        if unknown:
            raise ValueError(
                f"node {self.name!r}: optional inputs {unknown} are not among its inputs {list(self.inputs)}"
            )
        if self.loop_mode is LoopMode.FRAMES and self.engine != "ar":
            raise ValueError(f"node {self.name!r}: a frame node is an AR node")
        if self.engine not in ("ar", "stateless"):
            raise ValueError(f"node {self.name!r}: engine must be 'ar' or 'stateless', got {self.engine!r}")
        if self.loop_mode is LoopMode.FLOW and (
            self.engine != "ar" or self.kv_from is None or "x" not in self.inputs or "x" not in self.outputs
        ):
            raise ValueError(
                f"node {self.name!r}: a flow node is an AR view with kv_from set and a port 'x' "
                f"among both its inputs and outputs"
            )

        if self.loop_mode is LoopMode.VELOCITY and (
            self.engine != "ar" or self.kv_from is None or "x" not in self.inputs or "v" not in self.outputs
        ):
            raise ValueError(
                f"node {self.name!r}: a velocity node is an AR view with kv_from set, an input 'x' and an output 'v'"
            )
        if self.guidance and (self.loop_mode is not LoopMode.FLOW or self.name in self.guidance):
            raise ValueError(
                f"node {self.name!r}: guidance views {list(self.guidance)} need a flow node "
                f"(loop_mode FLOW) and cannot name the node itself"
            )
        if len(set(self.guidance)) != len(self.guidance):
            raise ValueError(f"node {self.name!r}: guidance views {list(self.guidance)} repeat a view")

    @property
    def module_name(self) -> str:
        return self.module or self.name

    @property
    def kv_sources(self) -> tuple[str, ...]:
        """The views whose KV this node reads: ``kv_from``, then its guidance views."""
        return ((self.kv_from,) if self.kv_from else ()) + self.guidance
