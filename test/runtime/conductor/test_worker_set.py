"""The worker-set contract: both implementations define every operation."""
from __future__ import annotations

import inspect

import pytest

from mstar.conductor.inprocess_workers import InProcessWorkers
from mstar.conductor.process_workers import ProcessWorkers
from mstar.conductor.remote_worker import RemoteWorker
from mstar.conductor.worker_set import WorkerLink, WorkerSet
from mstar.worker.worker import Worker
from support.conductor_helpers import config, run
from support.toy_factory import toy_streaming

IMPLEMENTATIONS = [InProcessWorkers, ProcessWorkers]
OPERATIONS = {"workers", "worker", "host_of", "start", "stop", "put_input", "worker_status", "refresh",
              "tensors_held"}


def test_the_contract_names_every_operation_the_conductor_uses():
    assert WorkerSet.__abstractmethods__ == OPERATIONS


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS, ids=lambda cls: cls.__name__)
def test_each_implementation_defines_every_operation_itself(implementation):
    assert not implementation.__abstractmethods__
    inherited = sorted(name for name in OPERATIONS if name not in vars(implementation))
    assert inherited == [], f"{implementation.__name__} leaves {inherited} to the contract"
    for name in OPERATIONS:
        contract, own = getattr(WorkerSet, name), getattr(implementation, name)
        if callable(contract):
            assert inspect.iscoroutinefunction(own) == inspect.iscoroutinefunction(contract), name


@pytest.mark.parametrize("link", [Worker, RemoteWorker], ids=lambda cls: cls.__name__)
def test_both_kinds_of_worker_offer_the_worker_link(link):
    methods = [name for name, value in vars(WorkerLink).items() if callable(value) and not name.startswith("_")]
    assert set(methods) == {"execute", "handle", "export_kv", "stats", "kv_blocks_used"}
    assert [name for name in methods if not callable(getattr(link, name, None))] == []


def test_an_embedded_worker_set_has_rank_zero_only():
    graph, modules = toy_streaming({"llm", "sum"})
    workers = InProcessWorkers(graph, modules, config())

    async def go():
        assert await workers.worker(0) is workers.local_worker
        with pytest.raises(KeyError):
            await workers.worker(1)
    run(go())
    assert workers.placement is None and workers.pool is None
