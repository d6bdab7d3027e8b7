"""BAGEL's own image options (mstar_graphs.bagel.image_options) and the Python API's refusals: each a
ValueError naming its field."""

from __future__ import annotations

import pytest

from mstar_graphs.bagel.frontend import BagelModel
from mstar_graphs.bagel.guidance import GuidanceParams
from mstar_graphs.bagel.image_options import EDIT_GUIDANCE, OptionError, parse_image_options


def test_options_override_the_tasks_defaults_and_read_form_text():
    g, think = parse_image_options(
        {"guidance": {"text_scale": "2.5", "interval": ["0", 1]}, "think": "true"}, edit=True, steps=7
    )
    assert think and g.steps == 7 and g.text_scale == 2.5 and g.interval == (0.0, 1.0)
    assert g.renorm == EDIT_GUIDANCE.renorm and g.image_scale == EDIT_GUIDANCE.image_scale
    assert parse_image_options(None, edit=False, steps=50) == (GuidanceParams(), False)


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"guidance": {"text_scale": 0}}, "guidance.text_scale"),
        ({"guidance": {"image_scale": float("nan")}}, "guidance.image_scale"),
        ({"guidance": {"timestep_shift": float("inf")}}, "guidance.timestep_shift"),
        ({"guidance": {"renorm": "local"}}, "guidance.renorm"),
        ({"guidance": {"interval": [-0.1, 1]}}, "guidance.interval"),
        ({"guidance": {"interval": 0.5}}, "guidance.interval"),
        ({"guidance": {"text_scale": True}}, "guidance.text_scale"),
        ({"think": 1}, "think"),
        ({"style": "x"}, "style"),
    ],
)
def test_bad_options_name_their_field(options, param):
    with pytest.raises(OptionError) as caught:
        parse_image_options(options, edit=False, steps=10)
    assert caught.value.param == param and str(caught.value).startswith(param)


@pytest.fixture(scope="module")
def bagel(ckpt) -> BagelModel:
    return BagelModel.load(ckpt, requests_only=True)


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda r: r.generate("x", guidance=GuidanceParams(text_scale=-1.0)), "text_scale"),
        (lambda r: r.generate("x", guidance=GuidanceParams(renorm="local")), "renorm"),
        (lambda r: r.generate("x", guidance=GuidanceParams(interval=(0.0, 1.5))), "interval"),
        (lambda r: r.generate("x", guidance=GuidanceParams(steps=251)), "steps"),
        (lambda r: r.generate("x", size=(40, 32)), "height 40"),
        (lambda r: r.generate("x", size=(0, 32)), "height 0"),
        (lambda r: r.generate("x", size=(32, 128)), "width 128"),
        (lambda r: r.generate(" "), "prompt"),
        (lambda r: r.think("x", max_think_tokens=0), "max_think_tokens"),
    ],
)
def test_python_api_refusals_name_the_field(bagel, make, field):
    with pytest.raises(ValueError, match=field):
        make(bagel.requests)
