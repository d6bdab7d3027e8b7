"""The generated Orpheus checkpoint (random weights): an LLM directory and a SNAC directory, for tests and benchmarks.

Each part is written by its own generator (``tiny_llm``, ``tiny_snac``) in the real layout;
``checkpoints.ensure_tiny_orpheus`` caches what :func:`write_tiny_orpheus` writes.
"""

from __future__ import annotations

from pathlib import Path

from mstar_graphs.orpheus.tiny_llm import write_tiny_llm
from mstar_graphs.orpheus.tiny_snac import write_tiny_snac

# preset -> (LLM preset, SNAC preset, SNAC overrides). "bench" keeps the real model's balance:
# in Orpheus 3B the LLM does ~93% of the FLOPs (46 GFLOP per 7-token frame vs 3.3 GFLOP per
# SNAC window), so the small bench LLM gets a SNAC decoder scaled down to match (~87%).
PRESETS: dict[str, tuple[str, str, dict[str, int] | None]] = {
    "tiny": ("tiny", "tiny", None),
    "bench": ("bench", "bench", {"decoder_dim": 256}),
    "bench-full-snac": ("bench", "bench", None),
    # `bench decode` runs only the LLM (its head ~15% of the weights, as in the 3B); the SNAC part
    # is the bench one so the checkpoint still serves speech end to end.
    "decode": ("decode", "bench", {"decoder_dim": 256}),
}


def parts(preset: str) -> tuple[str, str, dict[str, int] | None]:
    """(LLM preset, SNAC preset, SNAC overrides) of an Orpheus preset; ValueError names the known ones."""
    if preset not in PRESETS:
        raise ValueError(f"unknown Orpheus preset {preset!r} (known: {sorted(PRESETS)})")
    return PRESETS[preset]


def write_tiny_orpheus(directory: str | Path, preset: str = "tiny") -> None:
    """``<directory>/llm`` and ``<directory>/snac`` for ``preset``."""
    llm_preset, snac_preset, snac_overrides = parts(preset)
    write_tiny_llm(Path(directory) / "llm", llm_preset)
    write_tiny_snac(Path(directory) / "snac", snac_preset, overrides=snac_overrides)
