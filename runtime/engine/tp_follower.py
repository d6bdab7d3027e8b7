"""A tensor-parallel follower: rank k > 0 of a TP group, mirroring rank 0's AREngine.

It owns no scheduler, block manager or sampler: it receives rank 0's plans (see
``mstar.engine.tp_plan``) and makes the same forward / compute_logits calls on its
shard of the model, with its own paged KV cache (same block ids, its own KV heads),
so the collectives inside the model line up with rank 0's.
"""

from __future__ import annotations

import logging

import torch

from mstar.engine.ar_module import ARModule
from mstar.engine.attention.backend import AttentionContext
from mstar.engine.attention.select import select_attention_backend
from mstar.engine.intra_op import claim_team
from mstar.engine.kv_cache import PagedKVCache
from mstar.engine.tp_plan import Hello, PlanKind, StepPlan, plan_embeds, plan_metadata
from mstar.layers.linear_packing import pack_linears
from mstar.parallel.group import TPGroup

log = logging.getLogger("mstar.parallel")


class TPFollower:
    """``TPFollower(module, tp, device).run()`` blocks until rank 0's engine closes.

    ``module`` is this rank's shard (built / loaded with the same ``tp``). Dtypes, KV
    pool size and attention backend come from rank 0 (its EngineConfig), so followers
    need no config of their own.
    """

    def __init__(self, module: ARModule, tp: TPGroup, device: str | torch.device = "cpu") -> None:
        if tp.is_leader:
            raise ValueError("tensor-parallel rank 0 runs the AREngine, not a TPFollower")
        self.module = module
        self.tp = tp
        self.device = torch.device(device)
        self.steps = 0
        self.cache: PagedKVCache | None = None
        self._vocab: dict[tuple, torch.Tensor] = {}

    def run(self) -> None:
        """Serves plans until SHUTDOWN. A lost leader (its process died) raises RuntimeError."""
        claim_team()  # model work off the device thread: at the model's width, not the one-thread default
        try:
            hello = self.tp.broadcast(None, Hello)
        except Exception as exc:
            raise RuntimeError(f"TP rank {self.tp.rank}: no hello from the leader: {exc}") from exc
        self.module = self.module.to(device=self.device, dtype=getattr(torch, hello.dtype)).eval()
        if hello.pack_linears:  # the same kernels as the leader: a TP step waits for its slowest rank
            pack_linears(self.module, self.module.plain_linears)
        self.cache = PagedKVCache(
            self.module.kv_spec(), hello.num_blocks, hello.block_size, getattr(torch, hello.kv_dtype), self.device
        )
        backend = select_attention_backend(self.cache, hello.attention_backend)
        attn = AttentionContext(backend)
        log.info(
            "TP rank %d: following, %d KV blocks x %d tokens, %s attention",
            self.tp.rank,
            hello.num_blocks,
            hello.block_size,
            backend.name,
        )
        hidden: torch.Tensor | None = None
        with torch.inference_mode():
            while True:
                try:
                    plan = self.tp.broadcast(None, StepPlan)
                except Exception as exc:
                    raise RuntimeError(f"TP rank {self.tp.rank}: lost the leader: {exc}") from exc
                if plan.kind == PlanKind.SHUTDOWN:
                    log.info("TP rank %d: shutdown after %d steps", self.tp.rank, self.steps)
                    return
                if plan.kind == PlanKind.FORWARD:
                    if plan.copies:
                        self.cache.copy_blocks([tuple(p) for p in plan.copies])
                    backend.plan(plan_metadata(plan, self.device))
                    ids = torch.tensor(plan.ids, dtype=torch.long, device=self.device)
                    pos = torch.tensor(plan.positions, dtype=torch.long, device=self.device)
                    hidden = self.module(ids, pos, attn, **plan_embeds(plan, self.device))
                    self.steps += 1
                elif plan.kind == PlanKind.LOGITS:
                    if hidden is None:
                        raise RuntimeError(f"TP rank {self.tp.rank}: a logits plan came before any forward")
                    self.module.compute_logits(hidden[plan.rows], self._vocab_ids(plan.vocab))
                else:
                    raise RuntimeError(f"TP rank {self.tp.rank}: unknown plan kind {plan.kind}")

    def _vocab_ids(self, runs: list[tuple[int, int]] | None) -> torch.Tensor | None:
        if runs is None:
            return None
        key = tuple(tuple(r) for r in runs)
        ids = self._vocab.get(key)
        if ids is None:
            if len(self._vocab) > 64:
                self._vocab.clear()
            parts = [torch.arange(lo, hi) for lo, hi in key]
            ids = (torch.cat(parts) if parts else torch.empty(0, dtype=torch.long)).to(self.device)
            self._vocab[key] = ids
        return ids
