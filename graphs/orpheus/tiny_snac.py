"""Deterministic random SNAC checkpoints in the real hub layout, for tests and benchmarks.

``write_tiny_snac(dir)`` writes ``config.json`` (with ``"mstar_random_weights": true``)
and ``model.safetensors`` holding the FULL state dict of ``snac.SNAC(**config)``
(encoder included, as in the real file), so loaders see exactly the names and
shapes of ``hubertsiuzdak/snac_24khz``. Needs the reference ``snac`` package.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

# The hub's hubertsiuzdak/snac_24khz config.json (as used by Orpheus); about 19.8M params.
SNAC_24KHZ_CONFIG: dict[str, Any] = {
    "sampling_rate": 24000,
    "encoder_dim": 48,
    "encoder_rates": [2, 4, 8, 8],
    "decoder_dim": 1024,
    "decoder_rates": [8, 8, 4, 2],
    "attn_window_size": None,
    "codebook_size": 4096,
    "codebook_dim": 8,
    "vq_strides": [4, 2, 1],
    "noise": True,
    "depthwise": True,
}

PRESETS: dict[str, dict[str, Any]] = {
    # Same rates, strides, codebook and flags as 24 kHz (same token layout and audio length), small widths.
    "tiny": {**SNAC_24KHZ_CONFIG, "encoder_dim": 8, "decoder_dim": 32},
    # Real dimensions, random weights: for timing.
    "bench": dict(SNAC_24KHZ_CONFIG),
}

_SEED = 20240607


def write_tiny_snac(directory: str | Path, preset: str = "tiny", *, overrides: dict[str, Any] | None = None) -> Path:
    """Write a random SNAC checkpoint for ``preset`` ("tiny" or "bench") into ``directory``; return it.

    ``overrides`` replaces config fields (e.g. ``{"attn_window_size": 4, "decoder_dim": 128}``
    to exercise the attention block). Same preset and overrides -> byte-identical tensors.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown SNAC preset {preset!r}; choose one of {sorted(PRESETS)}")
    try:
        import snac
    except ImportError as exc:  # pragma: no cover - the dev environment has it
        raise ImportError("write_tiny_snac needs the reference 'snac' package (pip install snac)") from exc
    from mstar.weights import save_safetensors

    config = {**PRESETS[preset], **(overrides or {})}
    # fork_rng: build under a fixed seed without disturbing the caller's global RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_SEED)
        model = snac.SNAC(**config)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    _perturb(state, seed=_SEED + 1)

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({**config, "mstar_random_weights": True}, indent=2) + "\n")
    save_safetensors(state, directory, metadata={"mstar_random_weights": "true", "preset": preset})
    return directory


def _perturb(state: dict[str, torch.Tensor], seed: int) -> None:
    """Make the random weights exercise everything a parity test should see.

    At init, weight norm sets g = ||v|| (folding would be a no-op) and every Snake
    alpha is 1; randomise both so a wrong fold or a swapped alpha shows up.
    """
    gen = torch.Generator().manual_seed(seed)
    for name, t in state.items():
        if name.endswith(("parametrizations.weight.original0", ".alpha")):
            t.mul_(0.5 + torch.rand(t.shape, generator=gen, dtype=t.dtype))
