"""What compiling a forward needs here, and the inductor settings every compiled forward of the engine
uses (the AR forward: ``mstar.engine.compiled_forward``; a stateless node's: ``mstar.engine.compiled_node``)."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch

from mstar.layers.weight_only import COMPILED_QUANTIZATIONS

# Each frozen weight is a constant of its graph: another module of the same class (another engine) is
# another graph of the same code. Room for a few dozen before dynamo gives up on it.
RECOMPILE_LIMIT = 64


def frozen_and_tuned():
    """Inductor settings of a warm-up compile: weights as constants, GEMM kernels chosen by measuring."""
    import torch._inductor.config as inductor_config

    return inductor_config.patch(
        freezing=True,
        max_autotune_gemm=True,
        autotune_num_choices_displayed=0,  # inductor prints every measurement to stderr otherwise
        max_autotune_report_choices_stats=False,
    )


def compile_blocker(device: torch.device, tp_size: int, quantization: str) -> str | None:
    """Why this engine's forward cannot be compiled here (None: it can)."""
    if device.type != "cpu":
        return f"it runs on CPU only (the engine's device is {device})"
    if tp_size > 1:
        return "it is not supported with tensor parallelism"
    if quantization not in COMPILED_QUANTIZATIONS:
        return f"it runs bf16 or weight-only int8 / int4 linears, not quantization {quantization!r}"
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
    except Exception as exc:  # inductor found no compiler it can use
        return f"inductor needs a C++ compiler and found none ({type(exc).__name__}: {exc}; install g++)"
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.is_file():  # inductor builds its kernels as Python extensions
        return f"inductor builds Python extensions and {headers} is missing (install python3-dev)"
    return None


def one_line(exc: BaseException) -> str:
    """An exception as one line: its type and its message's first line."""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def graph_count() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
