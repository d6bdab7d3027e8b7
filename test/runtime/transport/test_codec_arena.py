"""The byte-level pieces: raw memcpy (incl. the multi-threaded path), inline codec, slot allocator."""

from __future__ import annotations

import pytest
import torch

from mstar.transport.arena import ALIGN, SlotAllocator
from mstar.transport.codec import decode_inline, destination, encode_inline, memcpy
from mstar.transport.handle import TensorHandle


def test_memcpy_large_copies_split_over_threads_cover_every_byte_exactly():
    count = (9 << 20) + 13  # above the threaded threshold, not a multiple of the piece size
    src = torch.randint(0, 256, (count,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    dst = torch.full((count + 2 * 4096,), 0xAB, dtype=torch.uint8)  # guard bytes on both sides
    memcpy(dst.data_ptr() + 4096, src.data_ptr(), count)
    assert torch.equal(dst[4096 : 4096 + count], src)
    assert bool((dst[:4096] == 0xAB).all()) and bool((dst[4096 + count :] == 0xAB).all())


def test_inline_codec_round_trips_bf16_and_rejects_a_wrong_length():
    t = torch.randn(3, 5).to(torch.bfloat16)
    handle = TensorHandle("k/1", (3, 5), "bfloat16", data=encode_inline(t))
    assert len(handle.data) == 30
    assert torch.equal(decode_inline(handle), t)
    with pytest.raises(ValueError, match="needs 30"):
        decode_inline(TensorHandle("k/2", (3, 5), "bfloat16", data=b"\0" * 29))
    with pytest.raises(ValueError, match="unknown tensor dtype 'float99'"):
        destination(TensorHandle("k/3", (1,), "float99"))


def test_slot_allocator_first_fit_coalesces_and_refuses_what_does_not_fit():
    slots = SlotAllocator(10 * ALIGN)
    a, b, c = slots.alloc(1), slots.alloc(ALIGN + 1), slots.alloc(3 * ALIGN)
    assert (a, b, c) == (0, ALIGN, 3 * ALIGN)  # sizes round up to whole cache lines
    assert slots.alloc(5 * ALIGN) is None  # 4 lines left
    slots.free(b)
    assert slots.alloc(ALIGN) == ALIGN  # first fit: b's old place
    slots.free(ALIGN)
    slots.free(a)
    slots.free(c)
    assert slots.free_bytes == 10 * ALIGN and slots.slots_in_use == 0
    assert slots.alloc(10 * ALIGN) == 0  # every free range merged back into one
