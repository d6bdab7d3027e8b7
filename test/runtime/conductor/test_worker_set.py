"""The worker-set contract: both implementations define every operation, and a Conductor
drives either through the same calls (the in-process / Worker-process choice is made once)."""

from __future__ import annotations

import functools
import inspect

import pytest

from mstar.conductor import Conductor
from mstar.conductor.inprocess_workers import InProcessWorkers
from mstar.conductor.process_workers import ProcessWorkers
from mstar.conductor.remote_worker import RemoteWorker
from mstar.conductor.worker_set import WorkerLink, WorkerSet
from mstar.worker.registry import MODELS
from mstar.worker.worker import Worker
from support.conductor_helpers import config, make_prompts, req, run
from support.toy_factory import REGISTRATION, toy_spec, toy_streaming

IMPLEMENTATIONS = [InProcessWorkers, ProcessWorkers]
OPERATIONS = {"workers", "worker", "host_of", "start", "stop", "put_input", "worker_status", "refresh", "tensors_held"}

# one process, every node on it: the calls are those of the embedded run, and the explicit
# transport keeps the Router from asking hosts (it does only to pick "auto" transports)
ONE_RANK = """
world_size: 1
node_groups:
  - {nodes: [llm, sum], ranks: [0]}
transport: {default: shm}
"""


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


def _record(monkeypatch, implementation: type, calls: list[str]) -> None:
    """Every contract operation of ``implementation`` appends its name to ``calls`` when used."""
    for name in OPERATIONS:
        own = vars(implementation)[name]
        if isinstance(own, property):

            def read(self, _get=own.fget, _name=name):
                calls.append(_name)
                return _get(self)

            monkeypatch.setattr(implementation, name, property(read))
        elif inspect.iscoroutinefunction(own):

            async def call_async(self, *args, _call=own, _name=name, **kwargs):
                calls.append(_name)
                return await _call(self, *args, **kwargs)

            monkeypatch.setattr(implementation, name, functools.wraps(own)(call_async))
        else:

            def call(self, *args, _call=own, _name=name, **kwargs):
                calls.append(_name)
                return _call(self, *args, **kwargs)

            monkeypatch.setattr(implementation, name, functools.wraps(own)(call))


async def _serve(conductor: Conductor) -> list[int]:
    """One request through every public entry point that reaches the Workers."""
    async with conductor:
        tokens = [
            int(item.data)
            async for item in conductor.submit(
                req(make_prompts([5], seed=1)[0], 6, request_id="r", session_id="s", outputs=frozenset({"token"}))
            )
        ]
        conductor.close_session("s")  # before waiting: a session keeps its KV
        await conductor.wait_idle(timeout=10)
        conductor.stats()
        conductor.kv_blocks_used()
        conductor.worker_status()
    return tokens


def _first_uses(calls: list[str]) -> list[str]:
    return list(dict.fromkeys(calls))


def test_a_conductor_built_either_way_makes_the_same_calls(tmp_path, monkeypatch):
    monkeypatch.setenv(MODELS.env, REGISTRATION)  # the Worker process builds the toy model by name
    embedded: list[str] = []
    distributed: list[str] = []
    _record(monkeypatch, InProcessWorkers, embedded)
    _record(monkeypatch, ProcessWorkers, distributed)
    graph, modules = toy_streaming({"llm", "sum"})
    embedded_tokens = run(_serve(Conductor(graph, modules, config=config())))
    placement = tmp_path / "placement.yaml"
    placement.write_text(ONE_RANK)
    distributed_tokens = run(_serve(Conductor.distributed(toy_spec(), placement, config=config())))

    assert embedded_tokens == distributed_tokens and len(embedded_tokens) == 6
    assert _first_uses(embedded) == _first_uses(distributed)
    assert set(embedded) == OPERATIONS - {"host_of"}  # the Router asks hosts only for "auto" transports
    for name in ("start", "stop", "put_input"):
        assert embedded.count(name) == distributed.count(name) == 1, name
