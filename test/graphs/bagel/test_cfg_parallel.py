"""The CFG-parallel Walk's parts: cfg_step (same bits as the engine's combine + Euler step), the branch gates
(same as flow_branches), next_walk's choice, and the shipped placement that splits the views."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mstar.placement import load_placement
from mstar_graphs.bagel.cfg_parallel import no_image_needed, no_text_needed, schedule, step_once
from mstar_graphs.bagel.flow_llm import BagelFlowLLM
from mstar_graphs.bagel.generation_params import GenerationParams
from mstar_graphs.bagel.graph import bagel_graph, make_next_walk
from mstar_graphs.bagel.guidance import GuidanceParams

PLACEMENT = Path(__file__).parents[3] / "config" / "placement" / "bagel-cfg-parallel.yaml"
T2I = GenerationParams(GuidanceParams(steps=6, interval=(0.5, 1.0)), 2, 3, "main")
EDIT = GenerationParams(
    GuidanceParams(steps=6, image_scale=2.0, interval=(0.0, 1.0), renorm="text_channel"), 2, 3, "view"
)
UNGUIDED_IMAGE = GenerationParams(GuidanceParams(steps=4, image_scale=1.0), 2, 3, "view")


def _state(params: GenerationParams, step: int):
    request = SimpleNamespace(inputs={"gen_params": params.pack()})
    return SimpleNamespace(request=request, call_counts={"cfg_step": step} if step else {})


def _engine_step(params: GenerationParams, x, velocities, step: int) -> torch.Tensor:
    """What the engine-resident flow does at ``step``: flow_combine, then x += dt * v (flow_state)."""
    inputs = {"gen_params": params.pack()}
    times = schedule(params)
    t = times.tolist()[step]
    v = BagelFlowLLM.flow_combine(None, velocities, inputs, step, t)  # type: ignore[arg-type]
    dt = (times[1:] - times[:-1]).tolist()[step]
    return x + dt * torch.as_tensor(v).float()


@pytest.mark.parametrize("params", [T2I, EDIT, UNGUIDED_IMAGE])
def test_cfg_step_takes_the_engines_guided_step_bit_for_bit_and_ends_with_the_latent(params):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 64, generator=g)
    steps = params.guidance.steps - 1
    for step in range(steps):
        text, image = no_text_needed(_state(params, step)), no_image_needed(_state(params, step))
        inputs = {
            "x": x,
            "gen_params": params.pack(),
            "v_cond": torch.randn(6, 64, generator=g),
            **({"step": torch.tensor(step)} if step else {}),
        }
        branch = [inputs["v_cond"]]
        if text:
            inputs["v_no_text"] = torch.randn(6, 64, generator=g)
        if image:
            inputs["v_no_image"] = torch.randn(6, 64, generator=g)
        flags = BagelFlowLLM.flow_branches(None, inputs, step, schedule(params).tolist()[step])  # type: ignore[arg-type]
        assert flags[1:] == [bool(text)] * (len(flags) > 1) + [bool(image)] * (len(flags) > 2)
        branch += [inputs.get("v_no_text")] * (len(flags) > 1) + [inputs.get("v_no_image")] * (len(flags) > 2)
        out = step_once(inputs)
        want = _engine_step(params, x, branch, step)
        if step + 1 < steps:
            assert set(out) == {"x", "step"} and int(out["step"]) == step + 1
            x = out["x"]
        else:
            assert set(out) == {"latent"}
            x = out["latent"]
        assert torch.equal(x, want)


def test_gates_follow_the_interval_and_the_image_branch():
    # shifted times 1, .92, .82, .67, .43: the last is at or below 0.5, unguided
    assert [no_text_needed(_state(T2I, s)) for s in range(5)] == [1, 1, 1, 1, 0]
    assert [no_image_needed(_state(T2I, s)) for s in range(5)] == [0] * 5  # "main": the full context's velocity
    assert [no_image_needed(_state(EDIT, s)) for s in range(5)] == [1] * 5
    assert [no_image_needed(_state(UNGUIDED_IMAGE, s)) for s in range(3)] == [0] * 3


def test_cfg_step_names_a_bad_step():
    with pytest.raises(ValueError, match=r"cfg_step: input 'step' is 5; the schedule has steps 0..4"):
        step_once(
            {"x": torch.zeros(6, 64), "step": torch.tensor(5), "gen_params": T2I.pack(), "v_cond": torch.zeros(6, 64)}
        )


def test_next_walk_takes_the_cfg_parallel_walk_only_when_asked():
    walk = make_next_walk(im_end=7)

    def after_prefill(meta):
        return walk(SimpleNamespace(request=SimpleNamespace(meta=meta), last_walk="prefill_text"))

    assert after_prefill({"task": "t2i", "guided": True}) == "image_gen_cfg"
    assert after_prefill({"task": "t2i", "guided": True, "cfg_parallel": True}) == "image_gen_cfg_parallel"
    assert after_prefill({"task": "t2i", "guided": False, "cfg_parallel": True}) == "image_gen"


def test_the_shipped_placement_puts_each_view_and_its_velocity_on_its_own_worker():
    placement = load_placement(str(PLACEMENT), bagel_graph(im_end=7))
    walk = "image_gen_cfg_parallel"
    ranks = {n: placement.lookup(n, walk).ranks for n in ("velocity", "velocity_cfg_text", "velocity_cfg_img")}
    assert ranks == {"velocity": (0,), "velocity_cfg_text": (1,), "velocity_cfg_img": (2,)}
    assert [placement.lookup(v, "prefill_vae").ranks for v in ("llm", "llm_cfg_text", "llm_cfg_img")] == [
        (0,),
        (1,),
        (2,),
    ]
    assert placement.placements_of("image_cfg") == [] and placement.skipped_walks == {"image_gen_cfg"}


def _together(tmp_path: Path) -> Path:
    """Every node on rank 0 of two (rank 1 idle): the views together."""
    path = tmp_path / "together.yaml"
    nodes = [n.name for n in bagel_graph(0).nodes]
    path.write_text(f"world_size: 2\ndevices: {{0: cpu, 1: cpu}}\nnode_groups:\n  - nodes: {nodes}\n    ranks: [0]\n")
    return path


def test_the_placement_switches_cfg_parallel_on_exactly_when_it_puts_the_views_apart(ckpt, tmp_path):
    from mstar_graphs.bagel.frontend import BagelModel
    from mstar_graphs.bagel.view_placement import views_apart

    graph = bagel_graph(0)
    assert views_apart(load_placement(str(PLACEMENT), graph))
    assert not views_apart(load_placement(str(_together(tmp_path)), graph))
    apart = BagelModel.load(ckpt, requests_only=True, placement=PLACEMENT)
    together = BagelModel.load(ckpt, requests_only=True, placement=_together(tmp_path))
    alone = BagelModel.load(ckpt, requests_only=True)
    guided = {"prompt": "a cube", "size": (32, 32), "guidance": GuidanceParams(steps=4), "seed": 1}
    assert apart.requests.generate(**guided).meta.get("cfg_parallel") is True
    for model in (together, alone):
        assert "cfg_parallel" not in model.requests.generate(**guided).meta
    forced = BagelModel.load(ckpt, requests_only=True, placement=_together(tmp_path), cfg_parallel=True)
    assert forced.requests.cfg_parallel  # an explicit choice wins over the file
    assert together.use_placement(PLACEMENT) and together.requests.cfg_parallel  # servers call it
