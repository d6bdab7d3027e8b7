"""``mstar-ros checkpoint info DIR``: what loading a pi0.5 checkpoint would use, without reading its weights."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "checkpoint",
        help="inspect a model checkpoint directory (pi0.5: LeRobot or openpi layout)",
        description="Checkpoint tools. Nothing here reads the weights themselves (only headers, "
        "configs, statistics and file names), so they answer in a moment for a 13 GB "
        "checkpoint.",
    )
    ck = p.add_subparsers(dest="checkpoint_command", required=True, metavar="CHECKPOINT_COMMAND")
    info = ck.add_parser(
        "info",
        help="print what a load of a pi0.5 checkpoint would use",
        description="Prints what `--weights DIR` would use: the layout (LeRobot or openpi's PyTorch "
        "conversion), model variant and sizes (checked against the tensor shapes in the "
        "safetensors headers), the cameras in the model's order (the names of the "
        "policy node's cameras.<name> parameters), state and action dims, the "
        "normalisation mode and where its statistics come from, and the tokenizer file. "
        "Exits 2 when a file a load needs is missing (naming the paths tried) or the "
        "shapes do not match the sizes; a missing tokenizer (LeRobot saves none) or a "
        "mismatch is named after everything else found is printed.",
    )
    info.add_argument("dir", type=Path, nargs="?", help="the checkpoint directory (default: the generated tiny one)")
    info.add_argument("--tokenizer", help="a tokenizer file or directory, as the node set's --tokenizer")
    info.add_argument("--asset-id", help="openpi: which assets/<asset_id>/norm_stats.json")
    info.set_defaults(run=_info)


def _info(args: argparse.Namespace) -> int:
    from mstar_graphs.pi05.checkpoint_layout import describe, inspect_checkpoint
    from mstar_graphs.pi05.checkpoints import parameter_counts, resolve_path
    from mstar_graphs.pi05.shape_check import check_shapes

    path = resolve_path(args.dir)
    layout = inspect_checkpoint(path, tokenizer=args.tokenizer, asset_id=args.asset_id, tokenizer_required=False)
    shapes = check_shapes(path, layout.config)
    for line in describe(layout, parameter_counts(path), shapes.lines()):
        print(line, flush=True)
    problems = [p for p in (shapes.problem(), layout.tokenizer_missing) if p]
    if problems:  # after the lines above, so what was found is shown too; main() prints it as one error line
        raise ValueError("; ".join(problems))
    return 0
