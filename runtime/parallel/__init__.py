"""Tensor parallelism: a TP group (torch.distributed; gloo on CPU, NCCL on CUDA), sharded
layers, and the leader/follower protocol that runs one AR engine across the group.

Rank 0 runs the normal ``AREngine(..., tp=group)``; every other rank runs
``TPFollower(module_shard, group, device).run()``.
"""
from mstar.parallel.follower import TPFollower
from mstar.parallel.group import TPGroup

__all__ = ["TPFollower", "TPGroup"]
