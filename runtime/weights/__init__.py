"""Checkpoint weights: read safetensors / torch checkpoints, load them into modules, write them."""

from mstar.weights.checkpoint_files import (
    CheckpointReader,
    WeightsError,
    checkpoint_tensor_names,
    iter_checkpoint_tensors,
)
from mstar.weights.loader import LoadReport, load_weights
from mstar.weights.no_random_init import no_random_init
from mstar.weights.save import save_safetensors

__all__ = [
    "CheckpointReader",
    "LoadReport",
    "WeightsError",
    "checkpoint_tensor_names",
    "iter_checkpoint_tensors",
    "load_weights",
    "save_safetensors",
    "no_random_init",
]
