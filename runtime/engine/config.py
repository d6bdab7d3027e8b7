"""Engine sizing, validated with errors that name the field."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import msgspec
import torch

from mstar.engine.dtype_choice import DtypeChoice, resolve_dtype
from mstar.engine.dtype_names import DTYPE_NAMES
from mstar.engine.starvation import DEFAULT_SHARE, DEFAULT_WAIT_MS, StarvationLimit
from mstar.layers.weight_only import COMPILED_QUANTIZATIONS, QUANTIZATIONS
from mstar.user_yaml import load_user_yaml_file


class EngineConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """KV pool and batch limits of one AR engine (and the stateless engine's batch size).

    ``num_kv_blocks`` sizes the pool directly; else ``kv_cache_mb`` does. ``dtype: auto`` (the default)
    runs the fastest dtype the device runs natively (mstar.engine.dtype_choice); ``kv_dtype`` follows
    ``dtype`` unless set.
    """

    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_mb: float = 256.0
    max_batched_tokens: int = 1024
    max_num_seqs: int = 64
    stateless_max_batch: int = 16
    stateless_max_wait_ms: float = 40.0  # later chunks may wait this long to share a batch
    dtype: str = "auto"
    kv_dtype: str | None = None
    attention_backend: str | None = None
    pack_linears: bool = True  # bf16 on CPU: weights reordered once for oneDNN (same results, faster)
    phase_align: bool = True  # start sequences in the running ones' decode_period phase (waits < period steps)
    priority_classes: bool = True  # serve control > interactive > batch (mstar.priority); False: first come first
    # the AR forward under torch.compile, compiled at start (mstar.engine.compiled_forward): true, false,
    # or "auto" (where it can: CPU, a C++ compiler, no tensor parallelism, quantization none / int8 / int4;
    # else eager); so are stateless nodes that name warm-up batches (SNAC: mstar.engine.compiled_node).
    # Compiled, the weights are frozen into the graphs and the linears are not packed by hand
    compile: bool | Literal["auto"] = False
    quantization: str = "none"  # "int8" / "int4": weight-only linears on CPU (mstar.layers.weight_only);
    # "int8_dynamic": int8 weights and activations (mstar.layers.dynamic_int8); "fp16": weights packed
    # as fp16 for fbgemm, fp32 activations (mstar.layers.fp16_weights)
    # due work that more urgent work keeps skipping takes one step after this wait (0 / null: strict
    # priority), and never more than starved_share of the device (mstar.engine.starvation)
    starvation_wait_ms: float | None = DEFAULT_WAIT_MS
    starved_share: float = DEFAULT_SHARE

    def __post_init__(self) -> None:
        checks = [
            ("block_size", self.block_size >= 1),
            ("num_kv_blocks", self.num_kv_blocks is None or self.num_kv_blocks >= 1),
            ("kv_cache_mb", self.kv_cache_mb > 0),
            ("max_batched_tokens", self.max_batched_tokens >= 1),
            ("max_num_seqs", self.max_num_seqs >= 1),
            ("stateless_max_batch", self.stateless_max_batch >= 1),
            ("stateless_max_wait_ms", self.stateless_max_wait_ms >= 0),
            ("dtype", self.dtype in DTYPE_NAMES),
            ("kv_dtype", self.kv_dtype in (None, "float32", "bfloat16", "float16")),
            ("quantization", self.quantization in QUANTIZATIONS),
            ("starvation_wait_ms", self.starvation_wait_ms is None or self.starvation_wait_ms >= 0),
            ("starved_share", 0 <= self.starved_share <= 1),
        ]
        if self.compile is True and self.quantization not in COMPILED_QUANTIZATIONS:
            raise ValueError(
                f"engine config: compile = True runs bf16 or weight-only int8 / int4 linears; quantization = "
                f"{self.quantization!r} is not supported with it (set one of them off)"
            )
        for name, ok in checks:
            if not ok:
                raise ValueError(
                    f"engine config: {name} = {getattr(self, name)!r} is invalid"
                    + (f" (expected one of {', '.join(DTYPE_NAMES)})" if name == "dtype" else "")
                    + (f" (expected one of {', '.join(QUANTIZATIONS)})" if name == "quantization" else "")
                )

    def starvation(self) -> StarvationLimit | None:
        """The bounded share of this config's engines when skipped (None: strict priority)."""
        return StarvationLimit.of(self.starvation_wait_ms, self.starved_share)

    def for_device(self, device: str | torch.device) -> tuple[EngineConfig, DtypeChoice]:
        """This config with ``dtype`` made concrete for ``device`` (``auto`` decided), and the choice."""
        choice = resolve_dtype(self.dtype, device)
        return msgspec.structs.replace(self, dtype=choice.dtype), choice


def load_engine_config(path: str | Path) -> EngineConfig:
    """EngineConfig from a YAML file; errors name the file and the bad field."""
    path = Path(path)
    data = load_user_yaml_file(path) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of engine settings, got {type(data).__name__}")
    try:
        return msgspec.convert(data, EngineConfig)
    except msgspec.ValidationError as exc:
        raise ValueError(f"{path}: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
