"""bf16 linears on CPU with their weights reordered once into oneDNN's blocked layout.

A plain ``F.linear`` in bf16 on CPU repacks the weight on every call: for the
small row counts of decode (M = 1..64) that repacking, from a weight that no
longer sits in cache, costs as much as the matmul. Packing once at load (what
torch's inductor does for frozen CPU graphs) measured, for 8 Llama layers of
width 512 with distinct weights: 5.6 -> 2.7 ms at M = 8, 83 -> 72 ms at M = 547,
with bit-identical results.

Chosen at run time: only bf16 weights on CPU, and only where this torch build has
the oneDNN ops and the CPU has bf16 support; everything else stays ``nn.Linear``.

Under ``torch.compile`` (``mstar.engine.compiled_forward``) a packed linear is the custom op
``mstar::packed_linear``: inductor cannot lower an opaque oneDNN weight, and an op keeps the
forward one graph instead of breaking it at every linear.
"""

from __future__ import annotations

import functools
import itertools
import logging
import weakref

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger("mstar.engine")

# Packed linears by key: a compiled graph names its linear by an int (the op cannot take the module).
_by_key: weakref.WeakValueDictionary[int, PackedLinear] = weakref.WeakValueDictionary()
_next_key = itertools.count()


@torch.library.custom_op("mstar::packed_linear", mutates_args=())
def packed_linear_op(x: torch.Tensor, key: int, out_features: int) -> torch.Tensor:
    """``PackedLinear`` number ``key`` applied to ``x`` (what a compiled graph calls)."""
    return _by_key[key].eager_forward(x)


@packed_linear_op.register_fake
def _packed_linear_shape(x: torch.Tensor, key: int, out_features: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], out_features))


@functools.cache
def packing_available() -> bool:
    """This torch build and CPU can run prepacked bf16 linears."""
    ops = getattr(torch.ops, "mkldnn", None)
    try:
        return (
            ops is not None
            and hasattr(ops, "_reorder_linear_weight")
            and hasattr(ops, "_linear_pointwise")
            and torch.backends.mkldnn.is_available()
            and bool(ops._is_mkldnn_bf16_supported())
        )
    except (AttributeError, RuntimeError):
        return False


class PackedLinear(nn.Module):
    """Drop-in for a bf16 CPU ``nn.Linear``: same outputs, the weight held only in packed form.

    Moved to another dtype or device (``.to``), it holds a plain dense weight instead, and
    packs again when it comes back to bf16 on CPU.
    """

    def __init__(self, linear: nn.Linear, name: str = "") -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.name = name
        self.bias = linear.bias
        self.dense: torch.Tensor | None = None
        self.register_buffer("packed", None, persistent=False)
        self._hold(linear.weight.detach())
        self._warned = False
        self.key = next(_next_key)
        _by_key[self.key] = self

    def _hold(self, weight: torch.Tensor) -> None:
        if weight.dtype == torch.bfloat16 and weight.device.type == "cpu" and packing_available():
            self.packed, self.dense = torch.ops.mkldnn._reorder_linear_weight(weight, None), None
        else:
            self.packed, self.dense = None, weight

    def __getstate__(self) -> dict:
        """deepcopy / pickle: the packed tensor is opaque (no storage), so it travels dense."""
        state = self.__dict__.copy()
        if self.packed is not None:
            state["_buffers"] = {**self._buffers, "packed": None}
            state["dense"] = self.packed.to_dense()
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        if self.dense is not None:
            self._hold(self.dense)
        self.key = next(_next_key)  # a copy is a linear of its own
        _by_key[self.key] = self

    def _apply(self, fn, recurse: bool = True):  # type: ignore[override]
        if self.packed is not None:
            probe = fn(torch.empty(0, dtype=torch.bfloat16))
            if probe.dtype == torch.bfloat16 and probe.device.type == "cpu":  # stays as it is (an engine's .to())
                packed, self.packed = self.packed, None
                super()._apply(fn, recurse)
                self.packed = packed
                return self
        weight = fn(self.packed.to_dense() if self.packed is not None else self.dense)
        self.packed = None  # mkldnn tensors cannot go through the generic conversion
        super()._apply(fn, recurse)
        self._hold(weight)
        return self

    @property
    def weight(self) -> torch.Tensor:
        """The dense weight; while packed, rebuilt on every read (slow: list such linears in
        the module's ``plain_linears``)."""
        if self.packed is None:
            assert self.dense is not None
            return self.dense
        if not self._warned:
            self._warned = True
            log.warning(
                "linear %r is packed but its .weight was read; unpacking it on every read "
                "(name it in the module's plain_linears to keep it plain)",
                self.name,
            )
        return self.packed.to_dense()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return packed_linear_op(x, self.key, self.out_features)
        return self.eager_forward(x)

    def eager_forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None or x.dtype != torch.bfloat16 or x.device.type != "cpu":
            return F.linear(x, self.weight.to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        state = "packed" if self.packed is not None else "dense"
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, {state}"
        )


def pack_linears(module: nn.Module, keep_plain: tuple[str, ...] = ()) -> int:
    """Replaces every bf16 CPU ``nn.Linear`` under ``module`` with a :class:`PackedLinear`, except
    the submodules named in ``keep_plain`` (their weight is read directly) and linears whose weight
    is shared with another module (tied embeddings). Returns how many were packed (0 when packing
    is not available). Idempotent."""
    if not packing_available():
        return 0
    shared = _shared_weights(module)
    targets = [
        (name, m)
        for name, m in module.named_modules()
        if type(m) is nn.Linear
        and name not in keep_plain
        and id(m.weight) not in shared
        and m.weight.dtype == torch.bfloat16
        and m.weight.device.type == "cpu"
    ]
    for name, linear in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, attr, PackedLinear(linear, name))
    return len(targets)


def parameter_count(module: nn.Module) -> int:
    """Parameters of ``module``, the weights of packed linears included (they are buffers then)."""
    packed = sum(
        m.in_features * m.out_features for m in module.modules() if isinstance(m, PackedLinear) and m.packed is not None
    )
    return packed + sum(p.numel() for p in module.parameters())


def packed_count(module: nn.Module) -> int:
    """How many linears under ``module`` hold packed weights now."""
    return sum(isinstance(m, PackedLinear) and m.packed is not None for m in module.modules())


def _shared_weights(module: nn.Module) -> set[int]:
    owners: dict[int, int] = {}
    for m in module.modules():
        for p in m.parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    return {pid for pid, n in owners.items() if n > 1}


# Row ranges of an LM head (constrained decoding reads e.g. one 4096-row slot per step):
# packed copies, cached per weight, together at most a quarter of the weight's rows
# (oldest dropped first), so the copies stay a fraction of the head.
_row_packs: dict[int, dict[tuple[int, ...], torch.Tensor]] = {}  # by id(weight), dropped with it


def linear_rows(x: torch.Tensor, weight: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """``x @ weight[lo:hi].T`` ([M, hi - lo]); on bf16 CPU through a cached packed copy of the rows."""
    budget = weight.shape[0] // 4
    if (
        hi - lo > budget
        or weight.dtype != torch.bfloat16
        or x.dtype != torch.bfloat16
        or weight.device.type != "cpu"
        or x.device.type != "cpu"
        or not packing_available()
    ):
        return F.linear(x, weight[lo:hi])
    packs = _row_packs.get(id(weight))
    if packs is None:  # keyed by id: tensors compare elementwise, so they cannot be dict keys
        packs = _row_packs[id(weight)] = {}
        weakref.finalize(weight, _row_packs.pop, id(weight), None)
    # New storage (``.data = ...``, as the loader does) or an in-place update makes old copies stale.
    version = 0 if weight.is_inference() else weight._version
    key = (lo, hi, weight.data_ptr(), version)
    packed = packs.get(key)
    if packed is None:
        while packs and sum(k[1] - k[0] for k in packs) + hi - lo > budget:
            packs.pop(next(iter(packs)))
        packed = packs[key] = torch.ops.mkldnn._reorder_linear_weight(weight[lo:hi].detach().contiguous(), None)
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
