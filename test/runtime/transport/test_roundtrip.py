"""Tensors of every dtype and shape cross between two real processes through every transport."""

from __future__ import annotations

import pytest
import torch

KINDS = ["inline", "shm", "tcp", pytest.param("mooncake", marks=pytest.mark.mooncake)]


def _exchange_for(kind, request):
    # Mooncake needs an endpoint on our side too (its own registered scratch buffer to read into).
    return request.getfixturevalue("mooncake_exchange" if kind == "mooncake" else "exchange")


@pytest.mark.parametrize("kind", KINDS)
def test_this_process_exports_peer_reads(kind, request, peer, cases, tx):
    if kind == "mooncake":
        tx.require_mooncake()
    ex = _exchange_for(kind, request)
    owner = f"to-peer-{kind}"
    for what, tensor in cases:
        exported = ex.export(ex.put(tensor, owner), kind)
        assert exported.nbytes == tensor.numel() * tensor.element_size(), what
        assert (exported.data is not None) == (kind == "inline"), what
        assert exported.location.startswith(
            {"inline": "inproc", "shm": "shm:", "tcp": "tcp:", "mooncake": "mooncake:"}[kind]
        ), exported.location
        tx.assert_same(peer.resolve(exported), tensor.contiguous(), f"{kind} {what}")
    assert ex.free_owner(owner) == len(cases)


@pytest.mark.parametrize("kind", KINDS)
def test_peer_exports_this_process_reads(kind, request, peer, cases, tx):
    if kind == "mooncake":
        tx.require_mooncake()
    ex = _exchange_for(kind, request)
    owner = f"from-peer-{kind}"
    for what, tensor in cases:
        handle = peer.put_export(tensor, owner, kind)
        assert handle.key.startswith(peer.tag + "/"), handle.key  # keys are unique across processes
        got = ex.get(handle)
        tx.assert_same(got, tensor, f"{kind} {what}")
    assert peer.call("free", owner) == len(cases)


def test_resolve_stacks_a_list_of_remote_handles(exchange, peer, tx):
    items = [torch.full((4,), float(i)) for i in range(3)]
    handles = [peer.put_export(t, "stream", kind) for t, kind in zip(items, ["shm", "tcp", "inline"])]
    tx.assert_same(exchange.resolve(handles), torch.stack(items), "stacked stream items")
    peer.call("free", "stream")


def test_shared_memory_reads_are_views_and_out_gives_a_copy(exchange, peer, tx):
    from mstar.transport.exchange import SHM_VIEW_MIN_BYTES

    n = SHM_VIEW_MIN_BYTES // 4
    small = peer.put_export(torch.arange(10.0), "owned", "shm")
    assert exchange.get(small).data_ptr() != exchange.get(small).data_ptr()  # small: a copy each time
    original = torch.arange(n, dtype=torch.float32)
    handle = peer.put_export(original, "owned", "shm")
    first, second = exchange.get(handle), exchange.get(handle)
    assert first.data_ptr() == second.data_ptr()  # both look at the producer's slot: no copy
    tx.assert_same(first, original, "view of the producer's arena")
    owned = exchange.get(handle, out=torch.empty(n))
    owned.zero_()  # scribbling on a copy must not reach the shared slot
    tx.assert_same(exchange.get(handle), original, "slot after mutating a copy")
    peer.call("free", "owned")
    peer.put_export(torch.ones(n), "reuser", "shm")  # likely lands in the freed slot
    assert float(owned.sum()) == 0.0  # the copy is independent of the slot's later contents
    peer.call("free", "reuser")


def test_read_into_preallocated_out(exchange, peer, tx):
    want = torch.randn(64, 64)
    out = torch.empty(64, 64)
    for kind in ("shm", "tcp", "inline"):
        out.zero_()
        got = exchange.get(peer.put_export(want, "out", kind), out=out)
        assert got is out, kind
        tx.assert_same(out, want, f"out= via {kind}")
    with pytest.raises(ValueError, match="out= for tensor"):
        exchange.get(peer.put_export(want, "out", "shm"), out=torch.empty(3))
    peer.call("free", "out")


def test_local_handles_stay_zero_copy(exchange):
    t = torch.randn(3, 3)
    h = exchange.put(t, "local")
    assert h.location == "inproc" and h.key.startswith(exchange.process_tag + "/")
    assert exchange.get(h) is t  # drop-in for InProcessTensorStore: engines get the very tensor
    assert exchange.get(exchange.export(h, "shm")) is t  # our own export still reads the local tensor
    assert len(exchange) == 1 and exchange.free_owner("local") == 1 and len(exchange) == 0


@pytest.mark.mooncake
def test_mooncake_overflow_buffers_and_chunked_reads_cross_processes(mooncake_exchange, peer, tx):
    tx.require_mooncake()
    ex = mooncake_exchange
    big = torch.randint(-100, 100, (3 << 20,), dtype=torch.int8)  # 3 MiB: past the 1 MiB arenas and scratch
    exported = ex.export(ex.put(big, "mc-big"), "mooncake")
    assert exported.location == f"mooncake:{ex.endpoints()['mooncake']}"
    assert ex.stats()["mooncake_free_bytes"] == 1 << 20  # it took an overflow buffer, not arena space
    tx.assert_same(peer.resolve(exported), big, "mooncake overflow buffer, read in scratch-sized chunks")
    tx.assert_same(ex.get(peer.put_export(big, "mc-big", "mooncake")), big, "peer's overflow buffer")
    ex.free_owner("mc-big")
    peer.call("free", "mc-big")
