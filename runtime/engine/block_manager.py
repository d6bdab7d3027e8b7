"""Paged KV block allocation: ref-counted blocks, copy-on-write forks, front eviction."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch


class OutOfBlocks(RuntimeError):
    """Not enough free KV blocks for a request; nothing was changed."""


@dataclass
class BlockTable:
    """One sequence's (request x node-view) KV blocks.

    Table token ``i`` lives at offset ``i % block_size`` of ``blocks[i // block_size]``
    and has absolute position ``first_position + i``. Invariant:
    ``len(blocks) == ceil(num_tokens / block_size)``.
    """

    blocks: list[int] = field(default_factory=list)
    num_tokens: int = 0  # tokens stored (or reserved) in blocks
    first_position: int = 0  # absolute position of the first token of blocks[0]


class BlockManager:
    """Hands out fixed-size KV blocks; blocks may be shared between tables (ref counts)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"BlockManager needs num_blocks > 0 and block_size > 0, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    # ---- accounting ---------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def ref_count(self, block: int) -> int:
        self._check_id(block)
        return self._ref[block]

    def assert_all_free(self) -> None:
        """Raise if any block is still referenced (a leaked table)."""
        used = self.num_used_blocks
        if used or any(self._ref):
            leaked = sum(1 for r in self._ref if r)
            raise RuntimeError(
                f"KV block leak: {used} of {self.num_blocks} blocks not free ({leaked} still referenced)"
            )

    # ---- growth -------------------------------------------------------------------

    def _needs_cow(self, table: BlockTable, new_tokens: int) -> bool:
        # The next token lands in the last block only if it is partly filled; if that
        # block is shared, writing into it would corrupt the other tables.
        return new_tokens > 0 and table.num_tokens % self.block_size != 0 and self._ref[table.blocks[-1]] > 1

    def blocks_needed(self, table: BlockTable, new_tokens: int) -> int:
        """New blocks ``append(table, new_tokens)`` would take (including a copy-on-write)."""
        if new_tokens < 0:
            raise ValueError(f"new_tokens must be >= 0, got {new_tokens}")
        bs = self.block_size
        total_blocks = -(-(table.num_tokens + new_tokens) // bs)
        return total_blocks - len(table.blocks) + int(self._needs_cow(table, new_tokens))

    def can_append(self, table: BlockTable, new_tokens: int) -> bool:
        return self.blocks_needed(table, new_tokens) <= len(self._free)

    def append(self, table: BlockTable, new_tokens: int) -> list[tuple[int, int]]:
        """Reserve room for ``new_tokens`` more tokens.

        Returns ``(src, dst)`` block copies the caller must apply (``PagedKVCache.copy_blocks``)
        before writing the new tokens. Raises ``OutOfBlocks`` and changes nothing if short.
        """
        needed = self.blocks_needed(table, new_tokens)
        if needed > len(self._free):
            raise OutOfBlocks(
                f"need {needed} KV blocks for {new_tokens} tokens, only {len(self._free)} free of {self.num_blocks}"
            )
        copies: list[tuple[int, int]] = []
        if self._needs_cow(table, new_tokens):
            src = table.blocks[-1]
            dst = self._alloc()
            self._ref[src] -= 1  # still > 0: it was shared
            table.blocks[-1] = dst
            copies.append((src, dst))
        total_blocks = -(-(table.num_tokens + new_tokens) // self.block_size)
        while len(table.blocks) < total_blocks:
            table.blocks.append(self._alloc())
        table.num_tokens += new_tokens
        return copies

    def slot_mapping(self, table: BlockTable, start: int, end: int) -> torch.Tensor:
        """int64 flat cache slots of table tokens ``[start, end)``."""
        if not 0 <= start <= end <= table.num_tokens:
            raise IndexError(f"slot range [{start}, {end}) outside the table's {table.num_tokens} tokens")
        bs = self.block_size
        if end - start <= 8:  # decode: plain Python beats building tensors
            return torch.tensor(self.slots(table, start, end), dtype=torch.int64)
        idx = torch.arange(start, end, dtype=torch.int64)
        blocks = torch.tensor(table.blocks, dtype=torch.int64)
        return blocks[idx // bs] * bs + idx % bs

    def slots(self, table: BlockTable, start: int, end: int) -> list[int]:
        """:meth:`slot_mapping` as a list (a few decode tokens: no tensor per sequence)."""
        if not 0 <= start <= end <= table.num_tokens:
            raise IndexError(f"slot range [{start}, {end}) outside the table's {table.num_tokens} tokens")
        bs, blocks = self.block_size, table.blocks
        return [blocks[i // bs] * bs + i % bs for i in range(start, end)]

    # ---- sharing and release ------------------------------------------------------

    def fork(self, table: BlockTable) -> BlockTable:
        """A new table sharing every block; copy-on-write happens on the next append."""
        for b in table.blocks:
            self._check_live(b)
        for b in table.blocks:
            self._ref[b] += 1
        return BlockTable(list(table.blocks), table.num_tokens, table.first_position)

    def free(self, table: BlockTable) -> None:
        """Drop the table's references; it becomes empty. Unreferenced blocks return to the pool."""
        self._release(table.blocks)
        table.blocks = []
        table.num_tokens = 0
        table.first_position = 0

    def evict_front(self, table: BlockTable, max_tokens: int) -> int:
        """Sliding window: drop whole leading blocks while at least ``max_tokens`` tokens remain.

        Advances ``first_position``; returns the number of tokens evicted.
        """
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        bs = self.block_size
        n = 0
        while n < len(table.blocks) and table.num_tokens - (n + 1) * bs >= max_tokens:
            n += 1
        if n == 0:
            return 0
        self._release(table.blocks[:n])
        del table.blocks[:n]
        table.num_tokens -= n * bs
        table.first_position += n * bs
        return n * bs

    # ---- internals ----------------------------------------------------------------

    def _alloc(self) -> int:
        b = self._free.popleft()
        assert self._ref[b] == 0, f"free-list block {b} has ref count {self._ref[b]}"
        self._ref[b] = 1
        return b

    def _release(self, blocks: list[int]) -> None:
        # Validate everything first so a bad table leaves the manager untouched.
        counts: dict[int, int] = {}
        for b in blocks:
            self._check_id(b)
            counts[b] = counts.get(b, 0) + 1
        for b, c in counts.items():
            if self._ref[b] < c:
                raise RuntimeError(f"double free of KV block {b}: ref count {self._ref[b]}, releasing {c}")
        for b in blocks:
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._free.append(b)

    def _check_id(self, block: int) -> None:
        if not 0 <= block < self.num_blocks:
            raise RuntimeError(f"unknown KV block {block} (pool has {self.num_blocks})")

    def _check_live(self, block: int) -> None:
        self._check_id(block)
        if self._ref[block] == 0:
            raise RuntimeError(f"KV block {block} is free but still in a table")
