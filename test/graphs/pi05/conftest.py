"""Shared pi0.5 test fixtures: the tiny checkpoint, loaded modules, and a paged-KV harness.

The harness drives ``Pi05Model`` the way the AR engine does, without the engine: a
``PagedKVCache`` with scattered blocks, the torch attention backend, one packed
prefill step with the prefix-bidirectional mask, then flow steps whose H suffix rows
per sequence are written into the same reserved slots every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from mstar.engine.attention.backend import AttentionContext
from mstar.engine.attention.metadata import AttentionMetadata, MaskKind, SeqAttention
from mstar.engine.attention.torch_backend import TorchAttentionBackend
from mstar.engine.kv_cache import PagedKVCache
from mstar_graphs.pi05.pi05 import Pi05Model, euler_step, flow_times
from mstar_graphs.pi05.prompt import build_prefix
from mstar_graphs.pi05.siglip import Pi05ImageEncoder
from mstar_graphs.pi05.tiny import write_tiny_pi05
from mstar_graphs.pi05.tokenizer import load_tokenizer
from support.pi05_layouts import train_sentencepiece


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory: pytest.TempPathFactory):
    return write_tiny_pi05(tmp_path_factory.mktemp("pi05_tiny") / "ckpt")


@pytest.fixture(scope="session")
def model(ckpt) -> Pi05Model:
    return Pi05Model.from_pretrained_dir(ckpt, progress=False)


@pytest.fixture(scope="session")
def encoder(ckpt) -> Pi05ImageEncoder:
    return Pi05ImageEncoder.from_pretrained_dir(ckpt, progress=False)


@pytest.fixture(scope="session")
def tokenizer(ckpt):
    return load_tokenizer(ckpt / "tokenizer.json")


def random_images(cameras: int, seed: int, size: int = 224) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (cameras, size, size, 3), generator=g, dtype=torch.uint8)


@dataclass
class Observation:
    """One robot's prefix: ids [P], image rows [P, W] (row-aligned, zeros elsewhere), mask [P]."""

    ids: torch.Tensor
    embeds: torch.Tensor
    mask: torch.Tensor
    packed_embeds: torch.Tensor = field(repr=False)


@torch.no_grad()
def make_observation(
    encoder: Pi05ImageEncoder, tokenizer, cameras: int, prompt: str, state: torch.Tensor, seed: int
) -> Observation:
    rows = encoder(**encoder.prepare_inputs([_call(random_images(cameras, seed))]))["embeds"][0]
    ids, mask = build_prefix(tokenizer, cameras, prompt, state, tokens_per_image=encoder.tokens_per_image)
    dense = torch.zeros(ids.shape[0], rows.shape[1])
    dense[mask] = rows
    return Observation(ids, dense, mask, rows)


def _call(images: torch.Tensor, rid: str = "r"):
    from mstar.graph.node import NodeCall

    return NodeCall(request_id=rid, inputs={"images": images})


class PagedHarness:
    """B sequences in one paged cache; prefix once, then Euler flow steps over the persisted KV."""

    def __init__(self, model: Pi05Model, num_blocks: int = 256, block_size: int = 16, seed: int = 0) -> None:
        self.model = model
        self.cache = PagedKVCache(model.kv_spec(), num_blocks, block_size)
        self.backend = TorchAttentionBackend(self.cache)
        self.attn = AttentionContext(self.backend)
        self.free = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
        self.tables: list[list[int]] = []
        self.lengths: list[int] = []

    def _slots(self, b: int, start: int, end: int) -> torch.Tensor:
        bs, blocks = self.cache.block_size, self.tables[b]
        return torch.tensor([blocks[j // bs] * bs + j % bs for j in range(start, end)], dtype=torch.int64)

    @torch.no_grad()
    def prefill(self, obs: list[Observation]) -> list[torch.Tensor]:
        """All prefixes packed into one step; returns each one's hidden states [P, W]."""
        horizon = self.model.action_horizon
        seqs, slots, start = [], [], 0
        for o in obs:
            n = o.ids.shape[0]
            need = -(-(n + horizon) // self.cache.block_size)  # room for the suffix rows too
            self.tables.append([self.free.pop() for _ in range(need)])
            self.lengths.append(n)
            b = len(self.tables) - 1
            seqs.append(SeqAttention(start, n, n, self.tables[b], mask=MaskKind.PREFIX_BIDIRECTIONAL, mask_arg=n))
            slots.append(self._slots(b, 0, n))
            start += n
        self.backend.plan(AttentionMetadata(seqs=seqs, slot_mapping=torch.cat(slots)))
        ids = torch.cat([o.ids for o in obs])
        pos = torch.cat([torch.arange(o.ids.shape[0]) for o in obs])
        hidden = self.model(
            ids, pos, self.attn, embeds=torch.cat([o.embeds for o in obs]), embed_mask=torch.cat([o.mask for o in obs])
        )
        return list(hidden.split([o.ids.shape[0] for o in obs]))

    @torch.no_grad()
    def velocity(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """x [B, H, A] at times t [B] -> v [B, H, A]; suffix K/V written into the reserved slots."""
        h = x.shape[1]
        seqs, slots, pos = [], [], []
        for b, n in enumerate(self.lengths):
            seqs.append(
                SeqAttention(b * h, h, n + h, self.tables[b], mask=MaskKind.PREFIX_BIDIRECTIONAL, mask_arg=n + h)
            )
            slots.append(self._slots(b, n, n + h))
            pos.append(torch.arange(n, n + h))
        self.backend.plan(AttentionMetadata(seqs=seqs, slot_mapping=torch.cat(slots)))
        return self.model.flow_velocity(x, t, torch.cat(pos), self.attn)

    def sample(self, noise: torch.Tensor, steps: int) -> torch.Tensor:
        x = noise.float()
        for t in flow_times(steps):
            v = self.velocity(x, torch.full((x.shape[0],), t, dtype=torch.float32))
            x = euler_step(x, v, -1.0 / steps)
        return x


@pytest.fixture
def harness(model) -> PagedHarness:
    return PagedHarness(model)


@pytest.fixture(scope="session")
def observe(encoder, tokenizer):
    def make(cameras: int, prompt: str, state: list[float], seed: int) -> Observation:
        return make_observation(encoder, tokenizer, cameras, prompt, torch.tensor(state), seed)

    return make


@pytest.fixture(scope="session")
def sp_model(tmp_path_factory):
    """PaliGemma-like SentencePiece model file (what openpi ships as paligemma_tokenizer.model)."""
    return train_sentencepiece(tmp_path_factory.mktemp("sp"))
