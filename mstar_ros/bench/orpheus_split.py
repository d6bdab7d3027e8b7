"""Orpheus at one concurrency level: one process vs the LLM and SNAC in two Worker processes.

Same checkpoint, same workload, same run: what splitting components across processes
costs (or gains) on this machine. Both use every core: one process runs torch on all
of them; two processes split them.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from mstar.conductor import Conductor
from mstar.engine.config import EngineConfig
from mstar.engine.dtype_choice import resolve_dtype
from mstar_graphs.orpheus.components import orpheus_spec
from mstar_ros.bench.orpheus import _ours
from mstar_ros.bench.workload import summarize, tts_workload

SPLIT_PLACEMENT = """world_size: 2
node_groups:
  - {nodes: [llm], ranks: [0]}
  - {nodes: [snac], ranks: [1]}
transport: {default: %s}
"""


async def orpheus_split_comparison(
    preset: str = "bench",
    concurrency: int = 8,
    requests: int = 16,
    rate: float = 10.0,
    seed: int = 0,
    transport: str = "shm",
    dtype: str = "auto",
) -> dict:
    from mstar_graphs.orpheus.frontend import OrpheusTTS

    tts = OrpheusTTS.load(preset=preset, progress=False)
    config = EngineConfig(dtype=dtype, kv_cache_mb=256)
    jobs = tts_workload(requests, rate, seed)
    single, _ = await _ours(tts, jobs, concurrency, config, label="1 proc")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "split.yaml"
        path.write_text(SPLIT_PLACEMENT % transport)
        conductor = Conductor.distributed(orpheus_spec(preset=preset), path, config=config)
        split, _ = await _ours(tts, jobs, concurrency, config, conductor=conductor, label="2 proc")
    one, two = summarize(single), summarize(split)
    return {
        "preset": preset,
        "concurrency": concurrency,
        "requests": requests,
        "transport": transport,
        "dtype": resolve_dtype(dtype).as_dict(),
        "single_process": one,
        "two_processes": two,
        "two_vs_single_throughput": round(two["throughput_audio_s_per_s"] / one["throughput_audio_s_per_s"], 3),
        "two_vs_single_ttfa_p50": round(two["ttfa_p50_ms"] / one["ttfa_p50_ms"], 3),
    }
