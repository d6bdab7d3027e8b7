"""OrpheusSnacStage vs the Orpheus reference pipeline (token -> codes, snac.decode, keep 2048:4096)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

snac = pytest.importorskip("snac")
from safetensors.torch import load_file  # noqa: E402

from mstar.engine.compile_support import graph_count  # noqa: E402
from mstar.engine.compiled_node import compile_nodes  # noqa: E402
from mstar.engine.device_loop import run_on_device  # noqa: E402
from mstar.graph.node import NodeCall  # noqa: E402
from mstar_graphs.orpheus.snac_config import SnacConfig  # noqa: E402
from mstar_graphs.orpheus.snac_stage import OrpheusSnacStage, window_noise_seed  # noqa: E402
from mstar_graphs.orpheus.tiny_snac import write_tiny_snac  # noqa: E402


def _reference_window(model: torch.nn.Module, tokens: list[int], seed: int, index: int) -> torch.Tensor:
    """The Orpheus decoder's conversion, written out independently of the stage."""
    frame = [t - 128266 - (i % 7) * 4096 for i, t in enumerate(tokens)]
    c0, c1, c2 = [], [], []
    for j in range(len(frame) // 7):
        i = 7 * j
        c0.append(frame[i])
        c1 += [frame[i + 1], frame[i + 4]]
        c2 += [frame[i + 2], frame[i + 3], frame[i + 5], frame[i + 6]]
    codes = [torch.tensor(c, dtype=torch.int64).unsqueeze(0) for c in (c0, c1, c2)]
    torch.manual_seed(window_noise_seed(seed, index))
    with torch.no_grad():
        audio = model.decode(codes)
    return audio[0, 0, 2048:4096]


def _random_window(gen: torch.Generator, frames: int = 4) -> torch.Tensor:
    codes = torch.randint(0, 4096, (frames, 7), generator=gen)
    return (codes + 128266 + torch.arange(7) * 4096).reshape(-1)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_snac(tmp_path_factory.mktemp("snac_stage"), "tiny")


@pytest.fixture(scope="module")
def reference(tiny_dir: Path) -> torch.nn.Module:
    model = snac.SNAC(**SnacConfig.from_dir(tiny_dir).snac_kwargs())
    model.load_state_dict(load_file(str(tiny_dir / "model.safetensors")))
    return model.eval()


@pytest.fixture(scope="module")
def stage(tiny_dir: Path) -> OrpheusSnacStage:
    return OrpheusSnacStage.from_pretrained_dir(tiny_dir, progress=False)


def _run(stage: OrpheusSnacStage, calls: list[NodeCall]) -> list[dict[str, torch.Tensor]]:
    return stage.split_outputs(stage(**stage.prepare_inputs(calls)), calls)


def test_window_matches_reference_pipeline(stage: OrpheusSnacStage, reference: torch.nn.Module) -> None:
    tokens = _random_window(torch.Generator().manual_seed(0))
    assert tokens.shape == (28,)
    call = NodeCall(request_id="r0", inputs={"codes": tokens}, index=3, seed=42)
    (out,) = _run(stage, [call])
    audio = out["audio"]
    assert audio.dtype == torch.float32 and audio.shape == (2048,)
    ref = _reference_window(reference, tokens.tolist(), seed=42, index=3)
    assert ref.abs().max() > 0.05
    torch.testing.assert_close(audio, ref, atol=1e-4, rtol=0)


def test_batching_equals_one_by_one(stage: OrpheusSnacStage) -> None:
    gen = torch.Generator().manual_seed(1)
    calls = [
        NodeCall(request_id=f"r{i}", inputs={"codes": _random_window(gen)}, index=i % 2, seed=7 + i // 2)
        for i in range(4)
    ]
    batched = _run(stage, calls)
    single = [_run(stage, [c])[0] for c in calls]
    for b, s in zip(batched, single):
        torch.testing.assert_close(b["audio"], s["audio"], atol=1e-5, rtol=0)
    # Different (seed, index) -> different noise -> different audio, even for the same tokens.
    same_tokens = [NodeCall("a", {"codes": calls[0].inputs["codes"]}, index=i, seed=0) for i in range(2)]
    a, b = _run(stage, same_tokens)
    assert not torch.allclose(a["audio"], b["audio"])


def test_prepare_inputs_shapes(stage: OrpheusSnacStage) -> None:
    gen = torch.Generator().manual_seed(2)
    calls = [NodeCall(f"r{i}", {"codes": _random_window(gen)}) for i in range(2)]
    batch = stage.prepare_inputs(calls)
    assert batch["codes_0"].shape == (2, 4) and batch["codes_1"].shape == (2, 8) and batch["codes_2"].shape == (2, 16)
    assert [tuple(batch[f"noise_{i}"].shape) for i in range(4)] == [
        (2, 1, 128),
        (2, 1, 1024),
        (2, 1, 4096),
        (2, 1, 8192),
    ]


@pytest.mark.parametrize("position", [0, 5, 27])
def test_invalid_token_names_request_and_position(stage: OrpheusSnacStage, position: int) -> None:
    tokens = _random_window(torch.Generator().manual_seed(3))
    tokens[position] = 128266 + ((position + 1) % 7) * 4096  # valid id, wrong slot
    ok = NodeCall("good", {"codes": _random_window(torch.Generator().manual_seed(4))})
    with pytest.raises(ValueError, match=rf"request bad: .*position {position}\b.*holds {int(tokens[position])}"):
        stage.prepare_inputs([ok, NodeCall("bad", {"codes": tokens})])


def test_bad_window_shapes(stage: OrpheusSnacStage) -> None:
    with pytest.raises(ValueError, match="7\\*F"):
        stage.prepare_inputs([NodeCall("r", {"codes": torch.full((27,), 128266)})])
    with pytest.raises(ValueError, match="keep_end"):  # one frame decodes to 2048 samples < 4096
        stage.prepare_inputs([NodeCall("r", {"codes": _random_window(torch.Generator(), frames=1)})])


def test_custom_keep_range(stage: OrpheusSnacStage) -> None:
    wide = OrpheusSnacStage(stage.decoder, keep_start=0, keep_end=8192)
    call = NodeCall("r", {"codes": _random_window(torch.Generator().manual_seed(5))}, index=1, seed=2)
    full = _run(wide, [call])[0]["audio"]
    part = _run(stage, [call])[0]["audio"]
    assert full.shape == (8192,)
    torch.testing.assert_close(full[2048:4096], part, atol=1e-6, rtol=0)


def test_window_noise_seed() -> None:
    seeds = {window_noise_seed(s, i) for s in range(20) for i in range(50)}
    assert len(seeds) == 1000
    assert all(0 <= x < 2**63 for x in seeds)
    assert window_noise_seed(5, 9) == window_noise_seed(5, 9)
    assert 0 <= window_noise_seed(-1, 0) < 2**63
    torch.manual_seed(window_noise_seed(2**64 - 1, 2**40))  # valid for torch


def test_edge_chunks_keep_what_the_middle_crop_drops(stage: OrpheusSnacStage) -> None:
    wide = OrpheusSnacStage(stage.decoder, keep_start=0, keep_end=8192)
    tokens = _random_window(torch.Generator().manual_seed(6))
    whole = {i: _run(wide, [NodeCall("r", {"codes": tokens}, index=i, seed=2)])[0]["audio"] for i in (0, 4)}
    first = _run(stage, [NodeCall("r", {"codes": tokens}, index=0, seed=2, meta={"first": 1})])[0]["audio"]
    torch.testing.assert_close(first, whole[0][:4096], atol=1e-5, rtol=0)
    last = _run(stage, [NodeCall("r", {"codes": tokens}, index=4, seed=2, meta={"final": 1})])[0]["audio"]
    torch.testing.assert_close(last, whole[4][2048:], atol=1e-5, rtol=0)
    # A final chunk that repeats window 4 (call index 5, all context) keeps its last two frames, its noise.
    again = _run(stage, [NodeCall("r", {"codes": tokens}, index=5, seed=2, meta={"final": 1, "left_context": 28})])[0][
        "audio"
    ]
    torch.testing.assert_close(again, whole[4][4096:], atol=1e-5, rtol=0)
    only = _run(stage, [NodeCall("r", {"codes": tokens}, index=0, seed=2, meta={"first": 1, "final": 1})])[0]
    torch.testing.assert_close(only["audio"], whole[0], atol=1e-5, rtol=0)
    short = _random_window(torch.Generator().manual_seed(7), frames=2)
    alone = _run(stage, [NodeCall("r", {"codes": short}, index=0, seed=2, meta={"first": 1, "final": 1})])[0]
    assert alone["audio"].shape == (2 * 2048,), "a stream shorter than a window is kept whole"
    # Calls that keep different samples never share a batch.
    middle = NodeCall("r", {"codes": tokens}, index=1, seed=2)
    edge = NodeCall("r", {"codes": tokens}, index=0, seed=2, meta={"first": 1})
    assert stage.batch_key(middle) != stage.batch_key(edge)
    with pytest.raises(ValueError, match="crops in one batch"):
        stage.prepare_inputs([middle, edge])


def test_compiled_it_serves_a_stream_s_middle_windows_as_eager_and_its_edges_eager(stage: OrpheusSnacStage) -> None:
    compiled = compile_nodes({"snac": stage}, torch.device("cpu"), "stateless:0", True, lambda node: "none")["snac"]
    assert compiled.graphs == 2  # a lone middle window; any number of them from 2 on
    gen = torch.Generator().manual_seed(5)
    batches = [[NodeCall(f"r{i}", {"codes": _random_window(gen)}, index=3, seed=i) for i in range(n)] for n in (1, 3)]
    edge = [NodeCall("e", {"codes": _random_window(gen)}, index=0, seed=9, meta={"first": True})]  # no graph: eager

    def serve(forward) -> list[torch.Tensor]:  # on the device thread, under inference_mode, as the engine does
        with torch.inference_mode():
            return [forward(**stage.prepare_inputs(calls))["audio"] for calls in (*batches, edge)]

    before = graph_count()
    got, want = run_on_device(serve, compiled), run_on_device(serve, stage)
    assert graph_count() == before  # nothing compiled while serving
    for a, b in zip(got[:2], want[:2], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * float(b.abs().max()))  # fp32, fused: rounding
    assert torch.equal(got[2], want[2])
