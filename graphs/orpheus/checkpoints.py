"""Where Orpheus weights come from: a local directory, or the deterministic tiny ones (cached)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from mstar_graphs.common.cache import cached_dir
from mstar_graphs.orpheus.tiny import parts, write_tiny_orpheus

log = logging.getLogger("mstar_graphs.orpheus")
TINY_VERSION = 2  # bump when the generators change, so stale caches are not reused


@dataclass(frozen=True)
class OrpheusPaths:
    llm: Path  # HF Llama layout: config.json, (sharded) safetensors, tokenizer.json
    snac: Path  # SNAC layout: config.json, model.safetensors or pytorch_model.bin

    @property
    def random_weights(self) -> bool:
        return any(
            json.loads((p / "config.json").read_text()).get("mstar_random_weights", False)
            for p in (self.llm, self.snac)
        )


def ensure_tiny_orpheus(preset: str = "tiny") -> OrpheusPaths:
    """The generated checkpoint for ``preset`` ("tiny" for tests, "bench"), made on first use."""
    parts(preset)  # an unknown preset fails before a cache directory is named after it
    root = cached_dir(
        f"orpheus-{preset}-v{TINY_VERSION}",
        lambda tmp: write_tiny_orpheus(tmp, preset),
        f"the {preset} Orpheus checkpoint (random weights)",
    )
    return OrpheusPaths(root / "llm", root / "snac")


def resolve_paths(
    weights: str | Path | None, snac_weights: str | Path | None = None, preset: str = "tiny"
) -> OrpheusPaths:
    """``weights``: an Orpheus LLM dir (HF layout); ``snac_weights``: a SNAC 24 kHz dir
    (default: ``<weights>/snac`` if present). None: the generated tiny checkpoint."""
    if weights is None:
        if snac_weights is not None:
            raise ValueError("--snac-weights needs --weights")
        return ensure_tiny_orpheus(preset)
    llm = Path(weights)
    if not (llm / "config.json").is_file():
        raise FileNotFoundError(f"{llm}: no config.json (expected an Orpheus checkpoint directory)")
    snac = Path(snac_weights) if snac_weights is not None else llm / "snac"
    if not (snac / "config.json").is_file():
        raise FileNotFoundError(f"{snac}: no config.json (pass --snac-weights DIR with the SNAC 24 kHz checkpoint)")
    return OrpheusPaths(llm, snac)
