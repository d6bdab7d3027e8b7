"""Tensor parallelism: TP=2 (two real processes, gloo over 127.0.0.1) serves the tiny Orpheus
LLM with the same greedy tokens as TP=1 and logits within 1e-4 (fp32).

Rank 0 runs the AREngine, rank 1 a TPFollower. The engine is stepped by hand, so both
runs see the same batches: chunked prefills mixed with decodes, a copy-on-write KV fork,
constrained (vocabulary subset) and full-vocabulary sampling. This file is also the
script each rank runs: ``python test_tensor_parallel.py RANK PORT OUT LLM_DIR``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mstar.engine.ar_engine import AREngine
from mstar.engine.config import EngineConfig
from mstar.engine.messages import ExecuteNode, LoopSpec
from mstar.engine.tp_follower import TPFollower
from mstar.parallel import TPGroup
from mstar.sampling_params import SamplingParams
from mstar.transport.inprocess import InProcessTensorStore
from mstar_graphs.orpheus.checkpoints import ensure_tiny_orpheus
from mstar_graphs.orpheus.config import LlamaConfig
from mstar_graphs.orpheus.frontend import OrpheusLLM
from mstar_graphs.orpheus.llama import LlamaForCausalLM
from mstar_graphs.orpheus.tiny_llm import config_dict

# small blocks and a small token budget: long prompts are chunked and share steps with decodes
# (float32: a parity test; this file is also a script, so support.parity is not importable here)
CONFIG = EngineConfig(dtype="float32", num_kv_blocks=48, block_size=4, max_batched_tokens=16)
VIEWS = ["llm", "llm2"]
TP = 2


def load(path: str | Path, tp: TPGroup | None = None) -> OrpheusLLM:
    return OrpheusLLM.from_pretrained_dir(path, progress=False, tp=tp).fuse_projections()


class Driver:
    """Steps the engine on this thread: the batches depend only on the submission order."""

    def __init__(self, engine: AREngine, store: InProcessTensorStore) -> None:
        self.engine, self.store, self.calls = engine, store, 0
        self.tokens: dict[str, list[int]] = {}

    def submit(self, rid: str, prompt: list[int], n: int, node: str = "llm", kv_from: str | None = None) -> None:
        self.calls += 1
        key = f"{rid}/{node}"
        self.tokens[key] = []
        msg = ExecuteNode(
            self.calls,
            rid,
            node,
            {"input_ids": self.store.put(torch.tensor(prompt), owner=rid)},
            sampling=SamplingParams(),
            loop=LoopSpec(max_iters=n),
            kv_from=kv_from,
        )

        def reply(out) -> None:
            assert out.error is None, out.error
            if "token" in out.outputs:
                self.tokens[key].append(int(self.store.get(out.outputs["token"])))

        self.engine.submit(msg, reply)
        self.engine.poll()

    def run(self, steps: int | None = None) -> None:
        while self.engine.has_work() and steps != 0:
            self.engine.step()
            steps = None if steps is None else steps - 1


def scenario(engine: AREngine, store: InProcessTensorStore, llm: OrpheusLLM) -> tuple[dict, list[torch.Tensor]]:
    """Greedy generations of several requests; returns their tokens and every logits tensor computed."""
    logits: list[torch.Tensor] = []
    compute = llm.compute_logits

    def recording(hidden: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
        out = compute(hidden, ids)
        logits.append(out.clone())  # the engine masks its copy in place
        return out

    llm.compute_logits = recording  # type: ignore[method-assign]
    gen = torch.Generator().manual_seed(7)
    prompt = lambda n: torch.randint(0, 512, (n,), generator=gen).tolist()  # noqa: E731
    d = Driver(engine, store)
    d.submit("a", prompt(6), 8)  # 13 tokens in KV: its last block is shared half full
    d.run(steps=3)
    d.submit("b", prompt(37), 6)  # prefilled in chunks while "a" decodes
    d.submit("c", prompt(3), 10)
    d.run()
    d.submit("a", prompt(2), 4, node="llm2", kv_from="llm")  # shares "a"'s blocks: copy-on-write
    d.run()
    llm.constrain = False  # full-vocabulary logits from here on
    d.submit("e", prompt(9), 5)
    d.submit("f", prompt(18), 3)
    d.run()
    llm.compute_logits = compute  # type: ignore[method-assign]
    return d.tokens, logits


def direct_logits(llm: OrpheusLLM) -> list[torch.Tensor]:
    """compute_logits called directly (every rank at once): full vocabulary and scattered ids."""
    hidden = torch.randn(3, llm.config.hidden_size, generator=torch.Generator().manual_seed(3))
    scattered = torch.tensor([156939, 5, 78470, 78469, 100000, 0, 42])
    with torch.inference_mode():
        return [llm.compute_logits(hidden), llm.compute_logits(hidden, scattered)]


def member(rank: int, port: int, out: str, path: str) -> None:
    torch.set_num_threads(1)
    tp = TPGroup.init(rank, TP, f"tcp://127.0.0.1:{port}", "cpu")
    llm = load(path, tp)
    if rank == 0:
        store = InProcessTensorStore()
        engine = AREngine(llm, VIEWS, store, CONFIG, tp=tp)
        tokens, logits = scenario(engine, store, llm)
        engine.close()
    else:
        TPFollower(llm, tp).run()
    direct = direct_logits(llm)
    big = list(range(-3000, 3000))  # a plan over one 4 KiB frame travels in two
    assert tp.broadcast(big if rank == 0 else None, list[int]) == big
    if rank == 0:
        torch.save({"tokens": tokens, "logits": logits, "direct": direct}, out)
    tp.destroy()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _max_rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    assert got.shape == ref.shape
    return float((got - ref).abs().max() / ref.abs().max())


def test_tp2_matches_tp1(tmp_path: Path) -> None:
    path = ensure_tiny_orpheus("tiny").llm
    out = tmp_path / "rank0.pt"
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    started = time.monotonic()
    logs = [open(tmp_path / f"rank{r}.log", "w+") for r in range(TP)]
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, str(r), str(port), str(out), str(path)],
            env=env,
            stdout=logs[r],
            stderr=subprocess.STDOUT,
        )
        for r in range(TP)
    ]
    try:
        llm = load(path)  # TP=1 here, while the ranks start
        store = InProcessTensorStore()
        ref_tokens, ref_logits = scenario(AREngine(llm, VIEWS, store, CONFIG), store, llm)
        ref_direct = direct_logits(llm)
        for r, p in enumerate(procs):
            p.wait(timeout=90)
            logs[r].seek(0)
            assert p.returncode == 0, f"rank {r} exited {p.returncode}:\n{logs[r].read()[-4000:]}"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for f in logs:
            f.close()
    got = torch.load(out)
    assert got["tokens"] == ref_tokens
    assert all(len(t) > 0 for t in ref_tokens.values())
    assert len(got["logits"]) == len(ref_logits) > 10
    widths = {t.shape[1] for t in ref_logits}
    assert 156940 in widths and any(w < 156940 for w in widths)  # full and restricted vocabulary
    for a, b in zip(got["logits"] + got["direct"], ref_logits + ref_direct):
        assert _max_rel_err(a, b) < 1e-4
    print(f"TP=2 vs TP=1: {len(ref_logits)} logits tensors, {time.monotonic() - started:.1f}s")


@pytest.mark.parametrize(
    "field,value,overrides",
    [
        ("num_attention_heads", 3, {"num_attention_heads": 3, "num_key_value_heads": 1}),
        ("num_key_value_heads", 1, {"num_key_value_heads": 1}),
        ("intermediate_size", 127, {"intermediate_size": 127}),
        ("vocab_size", 156941, {"vocab_size": 156941}),
    ],
)
def test_indivisible_sizes_name_the_field(field: str, value: int, overrides: dict) -> None:
    config = LlamaConfig.from_dict({**config_dict("tiny"), **overrides})
    with pytest.raises(ValueError, match=f"{field} = {value} is not divisible by tp_size = 2"):
        LlamaForCausalLM(config, device="meta", tp=TPGroup(0, 2))
    LlamaForCausalLM(config, device="meta", tp=TPGroup.single())  # fine without TP


def test_single_group_is_a_no_op_and_roles_are_checked() -> None:
    tp = TPGroup.single()
    t = torch.ones(3)
    assert tp.all_reduce_(t) is t and tp.all_gather(t) is t and tp.broadcast({"a": 1}, dict) == {"a": 1}
    with pytest.raises(ValueError, match="rank 0 runs the AREngine"):
        TPFollower(torch.nn.Linear(1, 1), TPGroup(0, 2))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not in a group"):
        TPGroup.init(2, 2, "tcp://127.0.0.1:1")


if __name__ == "__main__":
    member(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
