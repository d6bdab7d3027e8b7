"""The GGUF files of an Orpheus LLM directory (F16, Q8_0, Q4_K_M), made once and cached.

F16 is our export (mstar_ros.bench.gguf_export); the quantized files come from it through
llama.cpp's own ``llama_model_quantize``, as a llama.cpp user would make them.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from mstar_graphs.common.cache import cached_dir
from mstar_ros.bench.gguf_export import export_gguf

GGUF_VERSION = 1  # bump when the export changes, so stale caches are not reused
# file kind -> llama_ftype (llama.h: LLAMA_FTYPE_MOSTLY_Q8_0 = 7, LLAMA_FTYPE_MOSTLY_Q4_K_M = 15)
QUANTIZED = {"Q8_0": 7, "Q4_K_M": 15}
KINDS = ("F16", *QUANTIZED)


def quantize_gguf(source: str | Path, target: str | Path, kind: str, threads: int = 0) -> Path:
    """``source`` (an F16 GGUF) quantized to ``kind`` ("Q8_0" or "Q4_K_M") by llama.cpp, at ``target``."""
    import llama_cpp

    from mstar_ros.bench.llama_cpp_runner import silence_llama_cpp

    if kind not in QUANTIZED:
        raise ValueError(f"kind must be one of {sorted(QUANTIZED)}, got {kind!r}")
    silence_llama_cpp()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = QUANTIZED[kind]
    params.nthread = threads
    status = llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), params)
    if status != 0:
        raise RuntimeError(f"llama_model_quantize({kind}) of {source} returned {status}")
    return Path(target)


def _cache_name(llm_dir: Path) -> str:
    """Generated checkpoints are named by their cache directory; other weights by their path."""
    llm_dir = llm_dir.resolve()
    if llm_dir.name == "llm" and llm_dir.parent.name.startswith("orpheus-"):
        return f"gguf-v{GGUF_VERSION}-{llm_dir.parent.name}"
    digest = hashlib.sha1(str(llm_dir).encode()).hexdigest()[:12]
    return f"gguf-v{GGUF_VERSION}-{llm_dir.name}-{digest}"


def ensure_gguf_files(llm_dir: str | Path, threads: int = 0) -> dict[str, Path]:
    """{"F16": path, "Q8_0": path, "Q4_K_M": path} for ``llm_dir``, written on first use."""
    llm_dir = Path(llm_dir)

    def make(directory: Path) -> None:
        f16 = export_gguf(llm_dir, directory / "model-F16.gguf")
        for kind in QUANTIZED:
            quantize_gguf(f16, directory / f"model-{kind}.gguf", kind, threads)

    root = cached_dir(_cache_name(llm_dir), make, f"GGUF files of {llm_dir}")
    return {kind: root / f"model-{kind}.gguf" for kind in KINDS}
