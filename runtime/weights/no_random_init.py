"""Construct modules without torch's random init, for modules built on the meta device.

Why: a module's ``reset_parameters`` on a meta tensor runs torch's Python reference kernels, whose
first call imports ``torch._dynamo`` (about 2.3 s of every process start on these machines) for
fills that are thrown away: every weight is then loaded, or the module only describes shapes.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch
import torch.nn.init as init

# the fills that torch.nn modules call from reset_parameters
_FILLS = (
    "uniform_",
    "normal_",
    "trunc_normal_",
    "constant_",
    "ones_",
    "zeros_",
    "eye_",
    "dirac_",
    "xavier_uniform_",
    "xavier_normal_",
    "kaiming_uniform_",
    "kaiming_normal_",
    "orthogonal_",
    "sparse_",
)
_lock = threading.Lock()  # the fills are module attributes: one builder at a time swaps them


def _unchanged(tensor: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    return tensor


@contextlib.contextmanager
def no_random_init() -> Iterator[None]:
    """Inside, ``torch.nn.init``'s fills leave tensors as they are. Only for modules whose
    parameters are all loaded afterwards (or never used): they are otherwise uninitialised."""
    with _lock:
        saved = {name: getattr(init, name) for name in _FILLS if hasattr(init, name)}
        try:
            for name in saved:
                setattr(init, name, _unchanged)
            yield
        finally:
            for name, fill in saved.items():
                setattr(init, name, fill)
