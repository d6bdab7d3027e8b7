"""Builds the AR engine's core: the module placed on its device, a KV pool sized for it, the runner."""

from __future__ import annotations

import logging

import torch

from mstar.engine.ar_module import ARModule
from mstar.engine.attention.backend import AttentionBackend
from mstar.engine.attention.select import select_attention_backend
from mstar.engine.block_manager import BlockManager
from mstar.engine.compile_support import compile_blocker
from mstar.engine.compiled_forward import CompiledForward
from mstar.engine.config import EngineConfig
from mstar.engine.device_loop import run_on_device
from mstar.engine.engine_core import EngineCore
from mstar.engine.fed_inputs import waits_for_rows
from mstar.engine.frame_module import FrameModule
from mstar.engine.kv_cache import PagedKVCache
from mstar.engine.model_runner import ModelRunner
from mstar.engine.sampler import Sampler
from mstar.engine.scheduler import Scheduler
from mstar.engine.tp_plan import Hello, TPLeader
from mstar.layers.linear_packing import pack_linears, packed_count
from mstar.layers.weight_only import check_quantization_device, quantize_module, quantized_count
from mstar.parallel.group import TPGroup
from mstar.transport.inprocess import InProcessTensorStore

log = logging.getLogger("mstar.engine.ar")


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def block_size_for(module: ARModule, config: EngineConfig) -> int:
    """A frame module's KV block is one frame (its samples then share whole frames); else the config's."""
    return module.frame_tokens if isinstance(module, FrameModule) else config.block_size


def _kv_blocks(module: ARModule, config: EngineConfig, kv_dtype: torch.dtype) -> int:
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    per_block = module.kv_spec().bytes_per_token(kv_dtype) * block_size_for(module, config)
    return max(1, int(config.kv_cache_mb * 2**20) // per_block)


def _compiled(
    module: ARModule,
    device: torch.device,
    name: str,
    config: EngineConfig,
    blocker: str | None,
    backend: AttentionBackend,
):
    """The module's CompiledForward, warmed up; None when ``compile: auto`` finds it cannot be compiled here."""
    if blocker is not None:
        if config.compile == "auto":
            log.info("%s engine: forward eager (compile: auto, but %s)", name, blocker)
            return None
        raise ValueError(f"{name}: compile: true, but {blocker}")
    compiled = CompiledForward(module, name)
    try:
        seconds = run_on_device(compiled.warm_up, device, backend)
    except ValueError as exc:
        if config.compile != "auto":
            raise
        log.warning("%s engine: forward eager (compile: auto, but %s)", name, str(exc).removeprefix(f"{name}: "))
        return None
    log.info(
        "%s engine: forward compiled in %.1f s (%d new graphs; weights frozen into them, GEMM kernels tuned)",
        name,
        seconds,
        compiled.graphs,
    )
    return compiled


def build_core(
    module: ARModule,
    store: InProcessTensorStore,
    config: EngineConfig,
    device: torch.device,
    name: str,
    tp: TPGroup | None,
) -> EngineCore:
    """Places ``module`` on ``device`` and sizes its KV pool. ``tp``: the core is rank 0 of a
    tensor-parallel group (blocks until the other ranks follow)."""
    dtype = _dtype(config.dtype)
    kv_dtype = _dtype(config.kv_dtype or config.dtype)
    check_quantization_device(config.quantization, device, name)
    module = module.to(device=device, dtype=dtype).eval()
    if config.quantization != "none" and tp is not None and tp.size > 1:
        raise ValueError(f"{name}: quantization {config.quantization!r} is not supported with tensor parallelism yet")
    quantize_module(module, config.quantization)  # before packing: what it quantizes is not packed
    tp_size = tp.size if tp is not None else 1
    blocker = compile_blocker(device, tp_size, config.quantization) if config.compile else None
    if config.pack_linears and not (config.compile and blocker is None):  # compiled: inductor packs them
        pack_linears(module, module.plain_linears)
    num_blocks = _kv_blocks(module, config, kv_dtype)
    block_size = block_size_for(module, config)
    cache = PagedKVCache(module.kv_spec(), num_blocks, block_size, kv_dtype, device)
    blocks = BlockManager(num_blocks, block_size)
    backend = select_attention_backend(cache, config.attention_backend)
    leader = TPLeader(tp) if tp is not None and tp.size > 1 else None
    scheduler = Scheduler(
        blocks,
        leader.track_copies(cache) if leader else cache,
        config,
        period=module.decode_period() if config.phase_align else 1,
        waits=lambda seq: waits_for_rows(module, seq),
    )
    runner = ModelRunner(module, backend, blocks, device, plan_hook=leader.forward_plan if leader else None)
    if config.compile:
        compiled = _compiled(module, device, name, config, blocker, backend)
        if compiled is not None:
            runner.forward = compiled
        elif config.pack_linears:  # compile: auto fell back to the eager forward
            pack_linears(module, module.plain_linears)
    if leader is not None:  # followers size their KV pools and pick dtypes from this
        leader.hello(
            Hello(
                num_blocks,
                block_size,
                str(dtype).removeprefix("torch."),
                str(kv_dtype).removeprefix("torch."),
                backend.name,
                pack_linears=config.pack_linears,
            )
        )
    log.info(
        "%s engine: %d KV blocks x %d tokens (%s), attention backend %s, %d linears packed, %d %s",
        name,
        num_blocks,
        block_size,
        kv_dtype,
        backend.name,
        packed_count(module),
        quantized_count(module),
        f"{config.quantization} quantized",
    )
    return EngineCore(
        name, module, config, device, store, cache, blocks, backend, scheduler, runner, Sampler(), tp_leader=leader
    )
