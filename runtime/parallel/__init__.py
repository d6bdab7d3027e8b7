"""Tensor parallelism's process group (torch.distributed; gloo on CPU, NCCL on CUDA).

The layers that shard a model over it are in ``mstar.layers.tensor_parallel``; the
leader/follower protocol that runs one AR engine across it is in the engine: rank 0 runs
the normal ``AREngine(..., tp=group)`` (``mstar.engine.tp_plan``), every other rank runs
``TPFollower(module_shard, group, device).run()`` (``mstar.engine.tp_follower``).
"""

from mstar.parallel.group import TPGroup

__all__ = ["TPGroup"]
