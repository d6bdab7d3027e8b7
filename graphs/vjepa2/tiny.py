"""The generated V-JEPA 2-AC checkpoint (random weights) in Meta's layout, for tests and benchmarks.

Sizes are the ``config.PRESETS``; ``checkpoints.tiny_checkpoint`` caches what :func:`write_tiny` writes.
"""

from __future__ import annotations

from pathlib import Path

import torch

from mstar_graphs.vjepa2.checkpoints import AC_FILE
from mstar_graphs.vjepa2.config import PRESETS
from mstar_graphs.vjepa2.encoder import VJepa2Encoder
from mstar_graphs.vjepa2.predictor import VJepa2Predictor


def write_tiny(path: Path, preset: str = "tiny", seed: int = 0) -> None:
    """A random checkpoint in Meta's layout (``module.backbone.`` / ``module.`` names) + config.json."""
    config = PRESETS[preset]
    torch.manual_seed(seed)
    encoder, predictor = VJepa2Encoder(config), VJepa2Predictor(config)
    with torch.no_grad():  # small weights keep a deep random stack well-conditioned
        for module in (encoder, predictor):
            for name, p in module.named_parameters():
                if name.startswith(("action_encoder.", "state_encoder.")) and p.dim() >= 2:
                    p.normal_(0.0, 1.0)  # actions must move the predictions (a plan has energies to rank)
                elif p.dim() >= 2 or name.endswith("bias"):
                    p.normal_(0.0, 0.02)
    path.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "encoder": {f"module.backbone.{k}": v for k, v in encoder.state_dict().items()},
            "predictor": {f"module.{k}": v for k, v in predictor.state_dict().items()},
        },
        path / AC_FILE,
    )
    (path / "config.json").write_text(config.to_json())
