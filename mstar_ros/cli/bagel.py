"""``mstar-ros bagel ask|generate|edit``: an image-understanding and image-making model (BAGEL) from the
command line. Generic: it drives any served model (by ``--model`` name, default bagel) that answers in
text (``ask``) or makes images (``generate``, ``edit``), through the protocol of
mstar_ros.webrtc.image_models; nothing here is BAGEL's own code.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import TextIO

import numpy as np

from mstar.progress import progress_bar
from mstar_ros.dtype_option import add_dtype_argument, engine_config

DESCRIPTION = """\
BAGEL on the Walk Graph runtime: ask about an image, make images from a prompt, edit an image.

  mstar-ros bagel ask --image photo.jpg "What is on the table?"    (the answer streams to stdout)
  mstar-ros bagel generate "a red fox in snow" --size 512x512 --n 2 --seed 1 --out fox
                                                                  (writes fox-0.png, fox-1.png)
  mstar-ros bagel edit --image photo.jpg "make it night" --out night
  mstar-ros bagel generate "a cat" --think --cfg-text-scale 4 --cfg-interval 0.4 1 --steps 30
                                                                  (prints the plan, then the image)

generate and edit show a progress bar over the flow steps (stderr) and say where each PNG went.
Without --weights the model is a small generated checkpoint with RANDOM weights: it shows the
system working end to end; its answers and images are noise (the output says so)."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bagel",
        help="ask about an image, generate or edit images with BAGEL",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = p.add_subparsers(dest="bagel", required=True, metavar="WHAT")
    ask = what.add_parser("ask", help="answer a question about images (text streams to stdout)")
    ask.add_argument("question", help="what to ask")
    ask.add_argument("--image", type=Path, action="append", default=[], help="an image (repeat for several)")
    ask.add_argument("--max-tokens", type=int, help="most tokens in the answer (default: the model's)")
    ask.add_argument("--seed", type=int, help="fixes the sampling, for a reproducible answer")
    ask.add_argument("--temperature", type=float, help="0 for greedy (default: the model's)")
    ask.add_argument("--think", action="store_true", help="the model reasons first (the answer shows it)")
    ask.set_defaults(run=run, command_of=run_ask)
    gen = what.add_parser("generate", help="make images from a prompt (PNGs)")
    gen.add_argument("prompt", help="what to draw")
    gen.set_defaults(run=run, command_of=run_generate)
    edit = what.add_parser("edit", help="edit an image by an instruction (PNGs)")
    edit.add_argument("instruction", help="how to change the image")
    edit.add_argument("--image", type=Path, action="append", required=True, help="the image (repeat for several)")
    edit.set_defaults(run=run, command_of=run_edit)
    for q in (gen, edit):
        q.add_argument("--size", help="WIDTHxHEIGHT (default: the model's choice; edit: from the input image)")
        q.add_argument("--n", type=int, default=1, help="how many images (default 1)")
        q.add_argument("--seed", type=int, help="the same seed gives the same images (image i: seed + i)")
        q.add_argument("--steps", type=int, help="flow steps per image (default: the model's)")
        q.add_argument("--out", default="bagel", help="output prefix: PREFIX-0.png, PREFIX-1.png, ... (default bagel)")
        _add_guidance_flags(q)
    for q in (ask, gen, edit):
        q.add_argument("--model", default="bagel", help="the served model's name (default bagel)")
        q.add_argument("--weights", type=Path, help="checkpoint directory (default: the generated tiny one, RANDOM)")
        add_dtype_argument(q, default=None)
        q.add_argument("--engine-config", type=Path, help="engine settings YAML (see config/engine.yaml)")


# flag -> the model's ``guidance`` option field (mstar_graphs.bagel.image_options)
GUIDANCE_FLAGS = {
    "cfg_text_scale": "text_scale",
    "cfg_img_scale": "image_scale",
    "cfg_interval": "interval",
    "cfg_renorm_type": "renorm",
    "cfg_renorm_min": "renorm_min",
    "timestep_shift": "timestep_shift",
}


def _add_guidance_flags(q: argparse.ArgumentParser) -> None:
    g = q.add_argument_group("guidance (default: the model's for the task; the model judges the values)")
    g.add_argument("--cfg-text-scale", type=float, help="text guidance scale (<= 1: no guidance at all)")
    g.add_argument("--cfg-img-scale", type=float, help="image guidance scale (<= 1: no image branch)")
    g.add_argument("--cfg-interval", type=float, nargs=2, metavar=("LO", "HI"), help="guide only for LO < t <= HI")
    g.add_argument("--cfg-renorm-type", help="global, channel or text_channel")
    g.add_argument("--cfg-renorm-min", type=float, help="the renorm's lower clamp, in [0, 1]")
    g.add_argument("--timestep-shift", type=float, help="the schedule's shift (> 0)")
    g.add_argument("--think", action="store_true", help="plan the image in text first (printed)")


def image_options(args: argparse.Namespace) -> dict:
    """The model's own options from the flags given (none: {})."""
    guidance = {field: getattr(args, flag) for flag, field in GUIDANCE_FLAGS.items() if getattr(args, flag) is not None}
    options: dict = {"guidance": guidance} if guidance else {}
    if args.think:
        options["think"] = True
    return options


def run(args: argparse.Namespace) -> int:
    from mstar_ros.webrtc.speech_models import load_speech_model

    model = load_speech_model(args.model, str(args.weights) if args.weights else None)
    return args.command_of(model, args)


def _conductor(model, args: argparse.Namespace):
    from mstar.conductor import Conductor

    return Conductor(model.graph(), model.modules(), config=engine_config(args))


def _note_random(model, out: TextIO) -> None:
    if getattr(model, "random_weights", False):
        print(
            "NOTE: the weights are RANDOM (generated tiny checkpoint): the output is noise. Pass --weights DIR.",
            file=out,
        )


def read_image(path: Path) -> np.ndarray:
    """An image file -> HWC uint8 RGB; a ValueError naming the file when it is not a readable image."""
    import PIL.Image

    try:
        with PIL.Image.open(path) as image:
            return np.asarray(image.convert("RGB"), dtype=np.uint8)
    except FileNotFoundError:
        raise
    except Exception as exc:  # PIL's UnidentifiedImageError, a truncated file ...
        raise ValueError(f"--image {path}: not a readable image ({type(exc).__name__}: {exc})") from None


# -- ask -------------------------------------------------------------------------------------------
def run_ask(model, args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Stream the answer to ``args.question`` about ``args.image`` s to ``out`` (stdout)."""
    import msgspec

    out = out or sys.stdout
    if not getattr(model, "conversational", False):
        raise ValueError(f"{args.model} does not answer questions")
    images = [read_image(path) for path in args.image]
    if images and not getattr(model, "image_input", False):
        raise ValueError(f"{args.model} takes no images")
    sampling = model.default_sampling
    changes = {k: v for k, v in (("seed", args.seed), ("temperature", args.temperature)) if v is not None}
    if args.max_tokens is not None:
        if args.max_tokens < 1:
            raise ValueError("--max-tokens must be >= 1")
        changes["max_tokens"] = args.max_tokens
    sampling = msgspec.structs.replace(sampling, **changes) if changes else sampling
    extra: dict = {"images": images} if images else {}
    if args.think:
        extra["think"] = True
    request = model.request(
        args.question, history=[], sampling=sampling, outputs=frozenset({model.text_output}), speak=False, **extra
    )

    async def answer() -> None:
        ids: list[int] = []
        said = ""
        async with _conductor(model, args) as conductor:
            async for item in conductor.submit(request):
                if item.name != model.text_output:
                    continue
                ids.append(int(item.data))
                now = model.decode_text(ids)
                if now.startswith(said) and len(now) > len(said) and not now.endswith("\ufffd"):
                    out.write(now[len(said) :])
                    out.flush()
                    said = now
        out.write("\n")

    asyncio.run(answer())
    _note_random(model, out)
    return 0


# -- generate / edit -------------------------------------------------------------------------------
def run_generate(model, args: argparse.Namespace, out: TextIO | None = None) -> int:
    if not getattr(model, "image_generation", False):
        raise ValueError(f"{args.model} does not generate images")
    return _make_images(model, args, args.prompt, [], out or sys.stdout)


def run_edit(model, args: argparse.Namespace, out: TextIO | None = None) -> int:
    if not getattr(model, "image_edit", False):
        raise ValueError(f"{args.model} does not edit images")
    most = int(getattr(model, "max_input_images", 1))
    if len(args.image) > most:
        raise ValueError(f"{len(args.image)} --image: {args.model} takes at most {most}")
    images = [read_image(path) for path in args.image]
    return _make_images(model, args, args.instruction, images, out or sys.stdout)


def _make_images(model, args: argparse.Namespace, prompt: str, images: list[np.ndarray], out: TextIO) -> int:
    from mstar_ros.webrtc.image_encoding import encode_image
    from mstar_ros.webrtc.image_models import parse_size

    if not prompt.strip():
        raise ValueError("the prompt is empty")
    most = int(getattr(model, "max_images_per_request", 1))
    if not 1 <= args.n <= most:
        raise ValueError(f"--n {args.n}: 1 to {most} for {args.model}")
    if args.steps is not None and args.steps < 1:
        raise ValueError("--steps must be >= 1")
    size = model.image_size(parse_size(args.size, "--size"), [(im.shape[1], im.shape[0]) for im in images])
    steps = args.steps or getattr(model, "default_image_steps", 0)
    options = image_options(args)
    if options and not set(options) <= set(getattr(model, "image_options", ())):
        raise ValueError(f"{args.model} takes no {', '.join(sorted(options))} (its options: none of these flags)")
    extra = {"options": options} if options else {}
    thoughts: dict[int, str] = {}

    async def make() -> dict[int, np.ndarray]:
        finals: dict[int, np.ndarray] = {}
        done_steps = [0] * args.n
        async with _conductor(model, args) as conductor:
            with progress_bar(total=(steps * args.n) or None, desc="flow steps", unit="step") as bar:
                events = model.generate_images(
                    conductor,
                    prompt=prompt,
                    images=images,
                    size=size,
                    n=args.n,
                    seed=args.seed,
                    steps=args.steps,
                    partial_images=0,
                    request_id="cli",
                    **extra,
                )
                try:
                    async for event in events:
                        if event.steps and event.step > done_steps[event.index]:
                            if bar.total != event.steps * args.n:  # the model counts its steps its own way
                                bar.total = event.steps * args.n
                            bar.update(event.step - done_steps[event.index])
                            done_steps[event.index] = event.step
                        if event.kind == "final":
                            finals[event.index] = event.image
                            if event.revised_prompt is not None:
                                thoughts[event.index] = event.revised_prompt
                finally:
                    await events.aclose()
        return finals

    finals = asyncio.run(make())
    prefix = Path(args.out)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    for i in range(args.n):
        if i not in finals:
            raise RuntimeError(f"the model made no image {i}")
        path = prefix.with_name(f"{prefix.name}-{i}.png")
        path.write_bytes(encode_image(finals[i], "png"))
        if i in thoughts:
            print(f"thought {i}: {thoughts[i]}", file=out)
        print(f"wrote {path} ({finals[i].shape[1]}x{finals[i].shape[0]})", file=out)
    _note_random(model, out)
    return 0
