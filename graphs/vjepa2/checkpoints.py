"""Where V-JEPA 2-AC weights come from: Meta's AC checkpoint, transformers' encoder, or a tiny one.

Layouts accepted by ``--weights``:
- Meta's released file (``vjepa2-ac-vitg.pt``): a torch dict with ``encoder`` and ``predictor``
  state dicts whose names carry ``module.`` / ``module.backbone.``; like Meta's hub loader we drop
  ``module.`` and ``backbone.`` wherever they occur, and read it with ``weights_only=True``. Given
  as the file itself (released sizes) or in a directory beside our ``config.json``.
- transformers' ``VJEPA2Model`` directory (``config.json`` with ``model_type: vjepa2`` and
  ``model.safetensors``): the encoder (``encoder.layer.N.attention.{query,key,value}`` are joined
  into our fused ``qkv``). The predictor then comes from an AC ``*.pt`` in the same directory.
- Nothing: a tiny random checkpoint (Meta's layout, ``tiny.py``) generated once and cached.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from mstar.progress import progress_bar
from mstar.weights import WeightsError
from mstar.weights.checkpoint_files import iter_checkpoint_tensors
from mstar_graphs.common.cache import cached_dir
from mstar_graphs.vjepa2.config import PRESETS, RELEASED, EncoderConfig, PredictorConfig, VJepa2Config

log = logging.getLogger("mstar_graphs.vjepa2")
TINY_VERSION = 1
AC_FILE = "vjepa2-ac.pt"


@dataclass(frozen=True)
class VJepa2Source:
    config: VJepa2Config
    ac_file: Path | None  # Meta's dict with "encoder" / "predictor"
    hf_encoder: Path | None  # a transformers VJEPA2Model directory
    generated: bool = False  # random weights (say so in every output)


def clean_meta_key(name: str) -> str:
    """Meta's hub loader: ``module.`` and ``backbone.`` removed wherever they occur."""
    return name.replace("module.", "").replace("backbone.", "")


def hf_encoder_key(name: str) -> str | None:
    """transformers' VJEPA2 encoder name -> ours (``None``: not part of the encoder)."""
    if not name.startswith("encoder."):
        return None
    name = name.removeprefix("encoder.")
    name = name.replace("embeddings.patch_embeddings.", "patch_embed.")
    name = name.replace("layer.", "blocks.", 1) if name.startswith("layer.") else name
    name = name.replace(".attention.", ".attn.")
    return "norm." + name.removeprefix("layernorm.") if name.startswith("layernorm.") else name


def hf_config(path: Path) -> EncoderConfig:
    data = json.loads((path / "config.json").read_text())
    mlp_ratio = float(data.get("mlp_ratio", 4.0))
    width = int(data.get("hidden_size", 1024))
    return EncoderConfig(
        width=width,
        depth=int(data.get("num_hidden_layers", 24)),
        heads=int(data.get("num_attention_heads", 16)),
        mlp_hidden=int(width * mlp_ratio),
        image_size=int(data.get("crop_size", 256)),
        patch_size=int(data.get("patch_size", 16)),
        tubelet=int(data.get("tubelet_size", 2)),
        eps=float(data.get("layer_norm_eps", 1e-6)),
    )


def resolve_source(weights: str | Path | None = None, preset: str = "tiny") -> VJepa2Source:
    """What ``--weights`` names; errors say what was looked for."""
    if weights is None:
        if preset not in PRESETS or preset == "released":
            raise ValueError(
                f"no --weights given and preset {preset!r} has no generated checkpoint "
                f"(generated presets: {sorted(k for k in PRESETS if k != 'released')})"
            )
        path = tiny_checkpoint(preset)
        return VJepa2Source(VJepa2Config.from_dir(path), path / AC_FILE, None, generated=True)
    path = Path(weights).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"V-JEPA 2-AC weights {path} do not exist")
    if path.is_file():
        if path.suffix not in (".pt", ".pth"):
            raise ValueError(f"{path}: expected Meta's AC checkpoint (a .pt file) or a checkpoint directory")
        return VJepa2Source(RELEASED, path, None)
    pts = sorted(path.glob("*.pt")) + sorted(path.glob("*.pth"))
    config_file = path / "config.json"
    data = json.loads(config_file.read_text()) if config_file.exists() else {}
    if data.get("model_type") == "vjepa2":  # transformers' encoder (+ an AC file for the predictor)
        encoder = hf_config(path)
        config = VJepa2Config(
            encoder=encoder, predictor=PredictorConfig(num_frames=int(data.get("frames_per_clip", 64)))
        )
        return VJepa2Source(config.validated(), pts[0] if pts else None, path)
    if not pts:
        raise ValueError(f"{path}: no AC checkpoint (*.pt) and no transformers VJEPA2 config.json in it")
    config = VJepa2Config.from_dir(path) if config_file.exists() else RELEASED
    return VJepa2Source(config, pts[0], None)


def _read_ac(file: Path, part: str) -> dict[str, torch.Tensor]:
    try:
        data = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # a truncated file, a pickle with code in it, not a torch file
        raise WeightsError(
            f"{file}: cannot be read as a torch checkpoint with weights_only=True: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        ) from None
    if not isinstance(data, Mapping) or part not in data or not isinstance(data[part], Mapping):
        keys = sorted(data) if isinstance(data, Mapping) else type(data).__name__
        raise WeightsError(f"{file}: expected a dict with an {part!r} state dict (Meta's AC layout); found {keys}")
    return {clean_meta_key(k): v for k, v in data[part].items() if isinstance(v, torch.Tensor)}


def copy_strict(
    module: torch.nn.Module, tensors: Mapping[str, torch.Tensor], what: str, progress: bool = False
) -> None:
    """Every parameter from ``tensors``, shapes checked first; one error names every problem."""
    targets = module.state_dict()
    missing = sorted(set(targets) - set(tensors))
    unexpected = sorted(set(tensors) - set(targets))
    shapes = [
        f"{k}: checkpoint {tuple(tensors[k].shape)}, model {tuple(targets[k].shape)}"
        for k in sorted(set(targets) & set(tensors))
        if tuple(tensors[k].shape) != tuple(targets[k].shape)
    ]
    problems = [
        (f"missing {len(missing)}", missing),
        (f"unexpected {len(unexpected)}", unexpected),
        (f"shape mismatches {len(shapes)}", shapes),
    ]
    listed = [f"{head}: {', '.join(items[:8])}{' ...' if len(items) > 8 else ''}" for head, items in problems if items]
    if listed:
        raise WeightsError(f"{what}: {'; '.join(listed)}")
    params = dict(module.named_parameters())
    params.update(dict(module.named_buffers()))
    with torch.no_grad():
        for name in progress_bar(sorted(targets), desc=f"loading {what}", disable=not progress, unit="tensor"):
            params[name].copy_(tensors[name].to(params[name].dtype))


def encoder_tensors(source: VJepa2Source) -> tuple[dict[str, torch.Tensor], str]:
    if source.hf_encoder is not None:
        tensors: dict[str, list[tuple[str, torch.Tensor]] | torch.Tensor] = {}
        qkv: dict[str, dict[str, torch.Tensor]] = {}
        for name, t in iter_checkpoint_tensors(source.hf_encoder):
            ours = hf_encoder_key(name)
            if ours is None:
                continue
            for part in ("query", "key", "value"):
                marker = f".attn.{part}."
                if marker in ours:
                    head, kind = ours.split(marker)
                    qkv.setdefault(f"{head}.attn.qkv.{kind}", {})[part] = t
                    break
            else:
                tensors[ours] = t
        for name, parts in qkv.items():
            if set(parts) != {"query", "key", "value"}:
                raise WeightsError(
                    f"{source.hf_encoder}: {name} lacks {sorted({'query', 'key', 'value'} - set(parts))}"
                )
            tensors[name] = torch.cat([parts["query"], parts["key"], parts["value"]])
        return tensors, f"V-JEPA 2 encoder ({source.hf_encoder}, transformers layout)"  # type: ignore[return-value]
    if source.ac_file is None:
        raise WeightsError("no encoder weights: give Meta's AC checkpoint or a transformers VJEPA2 directory")
    return _read_ac(source.ac_file, "encoder"), f"V-JEPA 2 encoder ({source.ac_file})"


def load_encoder(source: VJepa2Source, dtype: torch.dtype = torch.float32, progress: bool = False):
    from mstar_graphs.vjepa2.encoder import VJepa2Encoder

    module = VJepa2Encoder(source.config, dtype=dtype)
    tensors, what = encoder_tensors(source)
    copy_strict(module, tensors, what, progress)
    return module.eval()


def load_predictor(source: VJepa2Source, dtype: torch.dtype = torch.float32, progress: bool = False):
    from mstar_graphs.vjepa2.predictor import VJepa2Predictor

    if source.ac_file is None:
        raise WeightsError(
            f"no predictor weights: {source.hf_encoder} holds only the encoder; put Meta's AC "
            f"checkpoint (*.pt) beside it"
        )
    module = VJepa2Predictor(source.config, dtype=dtype)
    copy_strict(module, _read_ac(source.ac_file, "predictor"), f"V-JEPA 2-AC predictor ({source.ac_file})", progress)
    return module.eval()


def tiny_checkpoint(preset: str = "tiny") -> Path:
    from mstar_graphs.vjepa2.tiny import write_tiny  # tiny writes this module's layout

    def make(p: Path) -> None:
        return write_tiny(p, preset)

    return cached_dir(f"vjepa2-{preset}-v{TINY_VERSION}", make, f"a random V-JEPA 2-AC checkpoint ({preset})")
