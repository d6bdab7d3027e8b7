"""``mstar-ros bagel ask|generate|edit`` driving a model with the capabilities (the toy image model,
injected into the command functions), its help, and its progress bar over the real tiny BAGEL's flow steps."""

from __future__ import annotations

import io

import numpy as np
import PIL.Image
import pytest

from mstar_graphs.bagel.frontend import BagelModel
from mstar_graphs.bagel.tiny import write_tiny_bagel
from mstar_ros.cli import bagel as cli_bagel
from mstar_ros.cli.main import build_parser
from support.images import picture
from support.toy_image_model import ToyImageModel, target_image


def args_of(*argv: str):
    return build_parser().parse_args(["bagel", *argv])


def test_help_explains_the_three_commands(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bagel", "--help"])
    text = capsys.readouterr().out
    assert all(word in text for word in ("ask", "generate", "edit", "RANDOM", "progress bar"))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bagel", "generate", "--help"])
    text = capsys.readouterr().out
    assert all(flag in text for flag in ("--size", "--n", "--seed", "--steps", "--out", "--weights"))


def test_generate_writes_pngs_and_says_the_weights_are_random(tmp_path, capsys):
    args = args_of(
        "generate", "a fox", "--size", "16x8", "--n", "2", "--seed", "4", "--steps", "3", "--out", str(tmp_path / "fox")
    )
    out = io.StringIO()
    assert args.command_of(ToyImageModel(), args, out=out) == 0
    paths = [tmp_path / "fox-0.png", tmp_path / "fox-1.png"]
    images = [np.asarray(PIL.Image.open(p)) for p in paths]
    assert all(im.shape == (8, 16, 3) for im in images)
    assert np.array_equal(images[0], target_image("a fox", (16, 8)).astype(np.uint8))
    assert f"wrote {paths[0]} (16x8)" in out.getvalue() and "RANDOM" in out.getvalue()
    assert "flow steps" in capsys.readouterr().err  # the progress bar, on stderr


def test_edit_writes_the_edited_image(tmp_path):
    source = tmp_path / "in.png"
    picture(24, 16, seed=3).save(source)
    args = args_of("edit", "--image", str(source), "invert it", "--out", str(tmp_path / "night"))
    assert args.command_of(ToyImageModel(), args, out=io.StringIO()) == 0
    made = np.asarray(PIL.Image.open(tmp_path / "night-0.png"))
    assert np.array_equal(made, 255 - np.asarray(PIL.Image.open(source).convert("RGB")))


def test_ask_streams_the_answer(tmp_path):
    source = tmp_path / "in.png"
    picture(30, 20, seed=3).save(source)
    args = args_of("ask", "--image", str(source), "what is this?")
    out = io.StringIO()
    assert args.command_of(ToyImageModel(), args, out=out) == 0
    assert out.getvalue().startswith("I see 30x20 image(s). You asked: what is this?\n")


def test_bad_inputs_are_refused_naming_them(tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a png")
    for argv, message in (
        (("generate", "x", "--size", "13x7"), "size 13x7"),
        (("generate", "x", "--size", "foo"), "--size 'foo'"),
        (("generate", "x", "--n", "9"), "--n 9"),
        (("edit", "--image", str(bad), "x"), f"--image {bad}"),
    ):
        args = args_of(*argv, "--out", str(tmp_path / "o")) if argv[0] != "ask" else args_of(*argv)
        with pytest.raises(ValueError, match=message.replace("'", ".")):
            args.command_of(ToyImageModel(), args, out=io.StringIO())


@pytest.fixture(scope="module")
def bagel(tmp_path_factory) -> BagelModel:
    return BagelModel.load(write_tiny_bagel(tmp_path_factory.mktemp("bagel") / "ckpt"), progress=False)


@pytest.mark.parametrize("command", ["generate", "edit"])
def test_the_progress_bar_follows_bagels_flow_steps(bagel, command, tmp_path, capsys, monkeypatch):
    updates: list[int] = []
    real_bar = cli_bagel.progress_bar

    def spy(*args, **kwargs):  # the real bar, its updates recorded
        bar = real_bar(*args, **kwargs)
        update = bar.update
        bar.update = lambda n=1: (updates.append(n), update(n))[1]
        return bar

    monkeypatch.setattr(cli_bagel, "progress_bar", spy)
    source = tmp_path / "in.png"
    picture(40, 24, seed=2).save(source)
    what = (
        ("generate", "a fox", "--size", "32x32") if command == "generate" else ("edit", "--image", str(source), "blue")
    )
    args = args_of(*what, "--n", "2", "--steps", "6", "--seed", "1", "--out", str(tmp_path / "o"))
    assert args.command_of(bagel, args, out=io.StringIO()) == 0
    assert updates == [1] * 10  # each of the 5 flow steps of each of the 2 images, one at a time
    err = capsys.readouterr().err
    assert "flow steps" in err and "10/10" in err
    width, height = bagel.image_size((32, 32), []) if command == "generate" else bagel.image_size(None, [(40, 24)])
    assert np.asarray(PIL.Image.open(tmp_path / "o-1.png")).shape == (height, width, 3)


def test_bagel_guidance_and_think_flags_reach_the_model(tmp_path, capsys):
    """The real tiny BAGEL: the flags become its options; a thinking generation prints its thought."""
    from mstar_ros.cli.main import main

    out = tmp_path / "cat"
    argv = ["bagel", "generate", "a cat", "--size", "32x32", "--steps", "2", "--seed", "1", "--out", str(out)]
    flags = ["--think", "--cfg-text-scale", "3", "--cfg-interval", "0", "1", "--cfg-renorm-type", "channel"]
    assert main([*argv, *flags]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}-0.png (32x32)" in printed and "thought 0: " in printed
    assert PIL.Image.open(f"{out}-0.png").size == (32, 32)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--cfg-text-scale", "0"], "guidance.text_scale"),
        (["--cfg-img-scale", "nan"], "guidance.image_scale"),
        (["--cfg-renorm-type", "local"], "guidance.renorm"),
        (["--cfg-interval", "0.5", "2"], "guidance.interval"),
        (["--cfg-renorm-min", "-1"], "guidance.renorm_min"),
        (["--timestep-shift", "inf"], "guidance.timestep_shift"),
        (["--steps", "300"], "steps"),
        (["--size", "50x64"], "size"),
    ],
)
def test_bad_bagel_flags_exit_2_naming_the_field(tmp_path, capsys, flags, named):
    from mstar_ros.cli.main import main

    argv = ["bagel", "generate", "a cat", "--size", "32x32", "--steps", "2", "--out", str(tmp_path / "o"), *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "mstar-ros bagel: error:" in err and named in err, err
