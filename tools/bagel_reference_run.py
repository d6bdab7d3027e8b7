"""Run ByteDance-Seed's own BAGEL code on CPU in float32 and save what it computes, for parity checks.

CI cannot reach GitHub, so the BAGEL parity tests compare against our own independent reference.
This developer tool closes the loop by hand: it imports the REAL reference source (a checkout of
github.com/ByteDance-Seed/Bagel, never committed here), builds the model the way ``app.py`` /
``inference.ipynb`` do from a checkpoint directory in BAGEL's released layout (``llm_config.json``,
``vit_config.json``, ``ema.safetensors``, ``ae.safetensors``, tokenizer files), runs fixed cases
through the reference's ``InterleaveInferencer`` and writes every intermediate we compare against
into one ``.npz`` plus a JSON summary.

    python tools/bagel_reference_run.py --bagel-src /tmp/bagel_src --checkpoint CKPT_DIR \\
        --out out/ref.npz --image cat.png --understand "What is this?" --t2i "a red cube" \\
        --edit "make it blue" --probe-text "hello world" --num-timesteps 4 --seed 0

or ``--cases cases.json`` (see ``--help`` for the format). ``out/ref.json`` gets the summary.

Stubs and patches installed before/after importing the reference (all CPU-only, none changes math):

* ``flash_attn``: a module whose ``flash_attn_varlen_func`` is an exact float32 equivalent
  (``varlen_attention`` in bagel_reference_stubs.py: per sequence from ``cu_seqlens``, GQA head h reads kv head
  h // (Hq/Hkv), causal mask bottom-right aligned when Lq != Lk, scale D^-0.5 by default). It has a
  ``__spec__`` because transformers probes ``importlib.util.find_spec("flash_attn")``.
* ``torchvision`` / ``torchvision.transforms`` / ``.functional``: only what ``data/transforms.py``'s
  ``ImageTransform`` uses on PIL images -- ``resize`` (PIL ``Image.resize`` with the mapped filter,
  which is what torchvision does for a PIL input), ``ToTensor`` (uint8 HWC -> float CHW / 255),
  ``Normalize`` ((x - mean) / std) and ``InterpolationMode``. Tensor inputs raise.
* ``cv2``: an empty module (imported by ``data/transforms.py`` for training augmentations only).
* float32 instead of bfloat16: ``qwen2_navit.py`` and ``siglip_navit.py`` cast q/k/v (and gen-mode
  rows) to ``torch.bfloat16`` unconditionally (the CUDA flash kernel needs it). Their module-level
  name ``torch`` is replaced by a proxy whose ``bfloat16`` is ``torch.float32``; everything else is
  the real torch. So the whole run is float32 (bf16 would also break on CPU: bf16 activations meet
  fp32 weights).
* Not stubbed (import fine on CPU): ``torch.compile(flex_attention)`` (lazy, never called at
  inference), ``modeling.cache_utils.taylorseer`` (TaylorSeer stays off), ``einops``, ``tqdm``.
  ``accelerate`` is not needed: the model is built on CPU and loaded with ``load_state_dict``.

Model build (as app.py): ``Qwen2Config.from_json_file`` + ``qk_norm=True``,
``tie_word_embeddings=False``, ``layer_module="Qwen2MoTDecoderLayer"``; ``SiglipVisionConfig`` +
``rope=False``, ``num_hidden_layers -= 1``; ``BagelConfig(visual_gen, visual_und,
vit_max_num_patch_per_side, connector_act, latent_patch_size, max_latent_size)`` where those four
and the two ``ImageTransform`` triples come from an optional ``"mstar_bagel"`` object in
``llm_config.json`` (defaults: app.py's 70 / gelu_pytorch_tanh / 2 / 64, VAE (1024, 512, 16), ViT
(980, 224, 14); ``latent_channels`` is accepted too and must equal the VAE's z);
``convert_conv2d_to_linear``; ``ema.safetensors`` loaded and checked strictly (``--allow-key-mismatch``
runs a partial checkpoint anyway: missing tensors keep their random init, an unreadable
``ae.safetensors`` gives a random FLUX-sized VAE; the summary lists what was missing).
VAE: the reference's ``load_ae`` when ``ae.safetensors`` has its hardcoded shapes (ch 128, mults
[1,2,4,4], 2 res blocks, z 16), else the reference ``AutoEncoder`` built with ``AutoEncoderParams``
inferred from the tensor shapes (``ae_params_from_shapes``) and loaded strictly. The tokenizer is
the reference's ``Qwen2Tokenizer.from_pretrained`` when ``vocab.json`` + ``merges.txt`` exist, else
``tokenizer.json`` through ``tokenizers`` (``JsonTokenizer``: encode without special tokens, decode
keeping them -- what the slow tokenizer does); then ``data_utils.add_special_tokens``.

Memory: the model is built in float32 on CPU (no meta device), so the released 7B MoT needs about
56 GB for the weights plus the bf16 ``ema.safetensors`` read at load (~29 GB) -- estimated, not run.

Cases (each prefixes its npz keys with its name ``<c>``; arrays float32 unless noted):

understand (``InterleaveInferencer`` with ``understanding_output=True``, greedy):
  ``<c>/prompt_ids`` int64 [T]: ``<|im_start|> + encode(question) + <|im_end|>`` as prefilled.
  ``<c>/vit_pixel_rows`` [N, 3*p*p], ``<c>/vit_position_ids`` int64 [N]: the ViT input (the image is
  first resized with the VAE rule, then the ViT rule -- the inferencer's own order).
  ``<c>/tokens`` int64 [n]: ``generate_text``'s output, first entry the ``<|im_start|>`` start token;
  ``<c>/new_tokens`` int64 [n-1]: the answer ids. ``max_new_tokens`` K is passed as
  ``max_length = K + 1`` because the reference counts the start token in ``max_length``.
  ``<c>/step_logits`` [steps, vocab]: ``lm_head`` of every decode step (step i predicts tokens[i+1];
  the last step's argmax is discarded by the reference when ``max_length`` is hit).
  ``<c>/text`` str: the decoded answer (between ``<|im_start|>`` and ``<|im_end|>``).
t2i / edit (``InterleaveInferencer`` with ``[prompt]`` / ``[image, prompt]``):
  ``<c>/noise`` [N, 64]: ``prepare_vae_latent``'s ``torch.randn`` draw (global RNG seeded with the
  case seed just before) or the ``noise`` .npy given.
  ``<c>/timesteps`` [S-1]: shifted t of each Euler evaluation (S = num_timesteps).
  ``<c>/x`` [S, N, 64]: x entering each evaluation, then the final latent (``x[0] == noise``).
  ``<c>/v`` [S-1, N, 64]: velocity after CFG/renorm (what the Euler step uses).
  ``<c>/v_cond``, ``<c>/v_cfg_text``, ``<c>/v_cfg_img`` [S-1, N, 64]: the branch velocities
  (NaN where the reference skipped a branch: scale <= 1 or outside ``cfg_interval``).
  ``<c>/cfg_text_scale_used``, ``<c>/cfg_img_scale_used`` [S-1]: scales after interval gating.
  ``<c>/latent`` [N, 64] (= ``x[-1]``), ``<c>/image`` uint8 [H, W, 3], ``<c>/image_shape`` int64 [2].
  ``<c>/prompt_ids`` int64 [T]; ``<c>/kv_lens``, ``<c>/ropes`` int64 [3]: (gen, cfg_text, cfg_img)
  context lengths and rope counters when generation starts.
  edit only: ``<c>/vae_input`` [1, 3, H, W] (VAE-transformed context image), ``<c>/context_latent``
  [1, z, H/8, W/8] (``vae_model.encode`` output used: mean with ``--vae-mean``, else the
  reference's sample ``mean + std * randn``), ``<c>/vit_pixel_rows``, ``<c>/vit_position_ids``.
probe (component calls of the reference on one image and one text):
  ``<c>/vit_pixels`` [3, H, W]: ``vit_transform(image)`` (no VAE-rule pre-resize here).
  ``<c>/vit_pixel_rows``, ``<c>/vit_position_ids``; ``<c>/vit_rows`` [N, Hd]: connector + vit_pos_embed
  rows as fed to the LLM; ``<c>/vit_span_out`` [N+2, Hd]: LLM output (final norm) of the
  ``[<|vision_start|>, rows, <|vision_end|>]`` prefill (und mode, empty context).
  ``<c>/vae_pixels`` [1, 3, H, W]: ``vae_transform(image)``; ``<c>/vae_latent_mean`` [1, z, h8, w8]:
  ``encode`` with the posterior mean; ``<c>/vae_tokens`` [N, 64] (patchified);
  ``<c>/vae_rows`` [N, Hd]: vae2llm + time_embedder(0) + latent_pos_embed; ``<c>/vae_span_out``
  [N+2, Hd]: LLM output of the clean-image prefill (gen mode, empty context);
  ``<c>/vae_decoded`` [1, 3, H, W]: ``decode`` of the mean latent; ``<c>/vae_decoded_image`` uint8
  [H, W, 3]: the inferencer's ``decode_image`` of the tokens.
  ``<c>/text_ids`` int64 [T] (``<|im_start|> text <|im_end|>``), ``<c>/text_positions`` int64 [T],
  ``<c>/text_embeds`` [T, Hd], ``<c>/text_layers`` [L, T, Hd] (each decoder layer's output),
  ``<c>/text_final`` [T, Hd] (after the final norm), ``<c>/text_logits`` [T, vocab],
  ``<c>/text_k``, ``<c>/text_v`` [L, T, Hkv, D] (the KV cache after the prefill, k after RoPE).

The JSON summary holds the build report (missing/unexpected keys, AE params, sizes, tokenizer),
each case's parameters, decoded text, context lengths, seconds taken and finiteness checks.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the stubs module beside this file
from bagel_reference_stubs import (  # noqa: E402
    TRANSFORMERS_COMPAT,
    app_configs,
    import_image_transform,
    install_import_stubs,
    install_transformers_compat,
    redirect_bf16_casts,
)

APP_SIZES: dict[str, Any] = {
    "vit_max_num_patch_per_side": 70,
    "connector_act": "gelu_pytorch_tanh",
    "latent_patch_size": 2,
    "max_latent_size": 64,
    "vae_transform": [1024, 512, 16],
    "vit_transform": [980, 224, 14],
}
# also accepted in mstar_bagel, checked against the VAE's z_channels (the reference reads it from there)
OPTIONAL_SIZES = ("latent_channels",)
# load_ae's hardcoded FLUX VAE parameters
LOAD_AE_PARAMS: dict[str, Any] = {"ch": 128, "ch_mult": [1, 2, 4, 4], "num_res_blocks": 2, "z_channels": 16}
# InterleaveInferencer.gen_image's defaults
FLOW_DEFAULTS: dict[str, Any] = {
    "num_timesteps": 50,
    "timestep_shift": 3.0,
    "cfg_text_scale": 4.0,
    "cfg_img_scale": 1.5,
    "cfg_interval": [0.4, 1.0],
    "cfg_renorm_type": "global",
    "cfg_renorm_min": 0.0,
}
CASE_KINDS = ("understand", "t2i", "edit", "probe")
CASE_FIELDS: dict[str, set[str]] = {
    "understand": {"image", "question", "max_new_tokens"},
    "t2i": {"prompt", "height", "width", "noise", *FLOW_DEFAULTS},
    "edit": {"image", "prompt", "noise", "vae_mean", *FLOW_DEFAULTS},
    "probe": {"image", "text"},
}


# ---------------------------------------------------------------- pure helpers (unit-tested)


def bagel_sizes(llm_json: dict[str, Any]) -> dict[str, Any]:
    """app.py's Bagel-level constants, overridden by ``llm_json["mstar_bagel"]`` (tiny checkpoints)."""
    extra = llm_json.get("mstar_bagel") or {}
    if not isinstance(extra, dict):
        raise ValueError(f"llm_config.json: mstar_bagel must be an object, got {type(extra).__name__}")
    known = set(APP_SIZES) | set(OPTIONAL_SIZES)
    unknown = sorted(set(extra) - known)
    if unknown:
        raise ValueError(f"llm_config.json: mstar_bagel has unknown keys {unknown}; known: {sorted(known)}")
    sizes = {**APP_SIZES, **extra}
    for name in ("vae_transform", "vit_transform"):
        triple = sizes[name]
        if not (isinstance(triple, list | tuple) and len(triple) == 3 and all(isinstance(x, int) for x in triple)):
            raise ValueError(f"llm_config.json: mstar_bagel.{name} must be [max_size, min_size, stride], got {triple}")
        sizes[name] = list(triple)
    for name in ("vit_max_num_patch_per_side", "latent_patch_size", "max_latent_size"):
        if not isinstance(sizes[name], int) or sizes[name] < 1:
            raise ValueError(f"llm_config.json: mstar_bagel.{name} must be a positive int, got {sizes[name]!r}")
    return sizes


def ae_params_from_shapes(shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """FLUX AutoEncoder sizes read off ``ae.safetensors`` tensor shapes (``load_ae`` hardcodes them)."""
    try:
        ch = shapes["encoder.conv_in.weight"][0]
        z_channels = shapes["decoder.conv_in.weight"][1]
    except KeyError as exc:
        raise ValueError(f"ae.safetensors: missing {exc.args[0]} (not a FLUX AutoEncoder state dict)") from None
    levels = sorted({int(name.split(".")[2]) for name in shapes if name.startswith("encoder.down.")})
    if levels != list(range(len(levels))) or not levels:
        raise ValueError(f"ae.safetensors: encoder.down levels {levels} are not 0..n-1")
    ch_mult = []
    for level in levels:
        width = shapes[f"encoder.down.{level}.block.0.conv1.weight"][0]
        if width % ch:
            raise ValueError(f"ae.safetensors: encoder.down.{level} width {width} is not a multiple of ch {ch}")
        ch_mult.append(width // ch)
    blocks = {int(name.split(".")[4]) for name in shapes if name.startswith("encoder.down.0.block.")}
    return {
        "ch": ch,
        "ch_mult": ch_mult,
        "num_res_blocks": len(blocks),
        "z_channels": z_channels,
        "downsample": 2 ** (len(levels) - 1),
    }


def load_cases(spec: dict[str, Any], base: Path) -> list[dict[str, Any]]:
    """Validate a case file's ``{"cases": [...]}``: kinds, fields, names unique, image paths resolved."""
    cases = spec.get("cases")
    if not isinstance(cases, list) or not cases:
        raise ValueError("case file: needs a non-empty list 'cases'")
    out, names = [], set()
    for index, case in enumerate(cases):
        kind = case.get("kind")
        if kind not in CASE_KINDS:
            raise ValueError(f"case {index}: kind {kind!r} is not one of {CASE_KINDS}")
        unknown = sorted(set(case) - CASE_FIELDS[kind] - {"kind", "name", "seed"})
        if unknown:
            raise ValueError(f"case {index} ({kind}): unknown fields {unknown}; allowed {sorted(CASE_FIELDS[kind])}")
        required = {"understand": ("image", "question"), "t2i": ("prompt",), "edit": ("image", "prompt")}
        for field in required.get(kind, ()):
            if field not in case:
                raise ValueError(f"case {index} ({kind}): missing field {field!r}")
        if kind == "probe" and "image" not in case and "text" not in case:
            raise ValueError(f"case {index} (probe): needs 'image' and/or 'text'")
        name = case.get("name", kind)
        if name in names:
            name = f"{name}{index}"
        names.add(name)
        resolved = {**case, "name": name}
        for field in ("image", "noise"):
            if field in resolved:
                resolved[field] = str((base / resolved[field]).resolve())
        out.append(resolved)
    return out


def flow_params(case: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """The flow/CFG keyword arguments of one generation case (case fields over command-line defaults)."""
    params = {name: case.get(name, defaults[name]) for name in FLOW_DEFAULTS}
    interval = params["cfg_interval"]
    if not (isinstance(interval, list | tuple) and len(interval) == 2):
        raise ValueError(f"case {case.get('name')}: cfg_interval must be [low, high], got {interval!r}")
    params["cfg_interval"] = [float(interval[0]), float(interval[1])]
    if params["cfg_renorm_type"] not in ("global", "channel", "text_channel"):
        raise ValueError(f"case {case.get('name')}: cfg_renorm_type {params['cfg_renorm_type']!r} unknown")
    if int(params["num_timesteps"]) < 2:
        raise ValueError(f"case {case.get('name')}: num_timesteps must be >= 2 (one Euler step)")
    return params


class JsonTokenizer:
    """The slice of a transformers tokenizer the reference uses, over a ``tokenizer.json``."""

    def __init__(self, path: Path):
        import tokenizers

        self._tok = tokenizers.Tokenizer.from_file(str(path))
        self.special_tokens_map = {
            "additional_special_tokens": [t.content for t in self._tok.get_added_tokens_decoder().values() if t.special]
        }

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def add_tokens(self, tokens: list[str]) -> int:
        return self._tok.add_tokens(tokens)

    def convert_tokens_to_ids(self, token: str) -> int:
        found = self._tok.token_to_id(token)
        if found is None:
            raise ValueError(f"tokenizer.json: no token {token!r}")
        return found

    def __len__(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)


class Reference(types.SimpleNamespace):
    """The built reference: model, vae_model, tokenizer, new_token_ids, inferencer, transforms, report."""


def load_reference(
    src: Path, ckpt: Path, *, allow_key_mismatch: bool = False, json_tokenizer: bool = False
) -> Reference:
    stubs = install_import_stubs()
    sys.path.insert(0, str(src))
    from data.data_utils import add_special_tokens
    from inferencer import InterleaveInferencer
    from modeling import autoencoder
    from modeling.bagel import (
        Bagel,
        BagelConfig,
        Qwen2Config,
        Qwen2ForCausalLM,
        SiglipVisionConfig,
        SiglipVisionModel,
        qwen2_navit,
        siglip_navit,
    )
    from safetensors import safe_open
    from safetensors.torch import load_file

    ImageTransform, image_stubs = import_image_transform()
    stubs += image_stubs
    redirect_bf16_casts(qwen2_navit, siglip_navit)
    torch.set_default_dtype(torch.float32)
    report: dict[str, Any] = {"stubs": stubs, "bagel_src": str(src), "checkpoint": str(ckpt)}

    llm_json = json.loads((ckpt / "llm_config.json").read_text())
    sizes = bagel_sizes(llm_json)
    report["sizes"] = sizes
    report["transformers_compat"] = install_transformers_compat() + [
        f"config.{k} = None if unset" for k in TRANSFORMERS_COMPAT
    ]
    llm_config, vit_config = app_configs(Qwen2Config, SiglipVisionConfig, ckpt)

    ae_path = ckpt / "ae.safetensors"
    with safe_open(str(ae_path), "pt") as f:
        names = f.keys()  # safe_open is not iterable
        ae_shapes = {name: tuple(f.get_slice(name).get_shape()) for name in names}
    try:
        ae = ae_params_from_shapes(ae_shapes)
        usable = True
    except ValueError as exc:
        if not allow_key_mismatch:
            raise SystemExit(f"{exc} (--allow-key-mismatch runs with a random FLUX-sized VAE)") from None
        ae, usable = {**LOAD_AE_PARAMS, "downsample": 8}, False
        report["ae_unusable"] = str(exc)
    report["ae_params"] = ae
    if not usable:
        vae_model, vae_config = autoencoder.load_ae(local_path=None)
        report["ae_loader"] = "load_ae(None): RANDOM weights, ae.safetensors unusable"
        ae_missing, ae_unexpected = sorted(vae_model.state_dict()), sorted(ae_shapes)
    elif {k: ae[k] for k in LOAD_AE_PARAMS} == LOAD_AE_PARAMS:
        vae_model, vae_config = autoencoder.load_ae(local_path=str(ae_path))
        report["ae_loader"] = "load_ae"
        expected = set(vae_model.state_dict())
        ae_missing, ae_unexpected = sorted(expected - set(ae_shapes)), sorted(set(ae_shapes) - expected)
    else:
        vae_config = autoencoder.AutoEncoderParams(
            resolution=256,
            in_channels=3,
            downsample=ae["downsample"],
            ch=ae["ch"],
            out_ch=3,
            ch_mult=ae["ch_mult"],
            num_res_blocks=ae["num_res_blocks"],
            z_channels=ae["z_channels"],
            scale_factor=0.3611,
            shift_factor=0.1159,
        )
        vae_model = autoencoder.AutoEncoder(vae_config)
        result = vae_model.load_state_dict(load_file(str(ae_path)), strict=False)
        ae_missing, ae_unexpected = sorted(result.missing_keys), sorted(result.unexpected_keys)
        report["ae_loader"] = "AutoEncoder(inferred params)"
    report["ae_missing"], report["ae_unexpected"] = ae_missing, ae_unexpected
    if sizes.get("latent_channels", ae["z_channels"]) != ae["z_channels"]:
        raise SystemExit(
            f"llm_config.json: mstar_bagel.latent_channels {sizes['latent_channels']} but ae.safetensors has "
            f"z_channels {ae['z_channels']} (the reference takes the latent width from the VAE)"
        )
    vae_model = vae_model.float().eval()

    config = BagelConfig(
        visual_gen=True,
        visual_und=True,
        llm_config=llm_config,
        vit_config=vit_config,
        vae_config=vae_config,
        vit_max_num_patch_per_side=sizes["vit_max_num_patch_per_side"],
        connector_act=sizes["connector_act"],
        latent_patch_size=sizes["latent_patch_size"],
        max_latent_size=sizes["max_latent_size"],
    )
    language_model = Qwen2ForCausalLM(llm_config)
    vit_model = SiglipVisionModel(vit_config)
    model = Bagel(language_model, vit_model, config)
    model.vit_model.vision_model.embeddings.convert_conv2d_to_linear(vit_config, meta=False)
    result = model.load_state_dict(load_file(str(ckpt / "ema.safetensors")), strict=False)
    report["ema_missing"], report["ema_unexpected"] = sorted(result.missing_keys), sorted(result.unexpected_keys)
    model = model.float().eval()
    mismatch = {k: report[k] for k in ("ema_missing", "ema_unexpected", "ae_missing", "ae_unexpected") if report[k]}
    if mismatch and not allow_key_mismatch:
        raise SystemExit(f"checkpoint keys do not match the reference model: {json.dumps(mismatch)[:4000]}")

    slow = (ckpt / "vocab.json").is_file() and (ckpt / "merges.txt").is_file()
    if slow and not json_tokenizer:
        from modeling.qwen2 import Qwen2Tokenizer

        tokenizer = Qwen2Tokenizer.from_pretrained(str(ckpt))
        report["tokenizer"] = "reference Qwen2Tokenizer (vocab.json + merges.txt)"
    else:
        tokenizer = JsonTokenizer(ckpt / "tokenizer.json")
        report["tokenizer"] = "tokenizer.json via tokenizers (no vocab.json/merges.txt)"
    tokenizer, new_token_ids, num_new_tokens = add_special_tokens(tokenizer)
    report["new_token_ids"] = {k: int(v) for k, v in new_token_ids.items()}
    report["num_new_tokens"] = int(num_new_tokens)
    if num_new_tokens:
        print(f"WARNING: the tokenizer lacked {num_new_tokens} BAGEL special tokens; ids past the vocab", flush=True)

    vae_transform = ImageTransform(*sizes["vae_transform"])
    vit_transform = ImageTransform(*sizes["vit_transform"])
    inferencer = InterleaveInferencer(model, vae_model, tokenizer, vae_transform, vit_transform, new_token_ids)
    return Reference(
        model=model,
        vae_model=vae_model,
        tokenizer=tokenizer,
        new_token_ids=new_token_ids,
        inferencer=inferencer,
        vae_transform=vae_transform,
        vit_transform=vit_transform,
        naive_cache=qwen2_navit.NaiveCache,
        report=report,
    )


# ---------------------------------------------------------------- capturing what the reference computes


class Patch:
    """Replace attributes for the length of a ``with`` block (wrappers get the original as first arg)."""

    def __init__(self):
        self._undo: list[tuple[Any, str, Any]] = []
        self._hooks: list[Any] = []

    def wrap(self, owner: Any, name: str, wrapper: Callable[..., Any]) -> None:
        original = getattr(owner, name)
        self._undo.append((owner, name, owner.__dict__.get(name, _ABSENT)))
        setattr(owner, name, lambda *a, **k: wrapper(original, *a, **k))

    def set(self, owner: Any, name: str, value: Any) -> None:
        self._undo.append((owner, name, owner.__dict__.get(name, _ABSENT)))
        setattr(owner, name, value)

    def hook(self, module: torch.nn.Module, fn: Callable[..., Any], pre: bool = False) -> None:
        self._hooks.append(module.register_forward_pre_hook(fn) if pre else module.register_forward_hook(fn))

    def __enter__(self) -> Patch:
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._hooks:
            handle.remove()
        for owner, name, value in reversed(self._undo):
            if value is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


_ABSENT = object()


def _np(tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.detach().cpu()
    return (
        tensor.numpy()
        if tensor.dtype in (torch.int64, torch.int32, torch.uint8, torch.bool)
        else tensor.float().numpy()
    )


def _image(path: str):
    from PIL import Image

    with Image.open(path) as img:
        img.load()
        return img.copy()


def _record_prompts(patch: Patch, ref: Reference, store: dict[str, list]) -> None:
    def prepare_prompts(original, *a, **k):
        generation_input, newlens, new_rope = original(*a, **k)
        store.setdefault("prompt_ids", []).append(_np(generation_input["packed_text_ids"]))
        return generation_input, newlens, new_rope

    def prepare_vit_images(original, *a, **k):
        generation_input, newlens, new_rope = original(*a, **k)
        store.setdefault("vit_pixel_rows", []).append(_np(generation_input["packed_vit_tokens"]))
        store.setdefault("vit_position_ids", []).append(_np(generation_input["packed_vit_position_ids"]))
        return generation_input, newlens, new_rope

    patch.wrap(ref.model, "prepare_prompts", prepare_prompts)
    patch.wrap(ref.model, "prepare_vit_images", prepare_vit_images)


def run_understand(ref: Reference, case: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    max_new = int(case.get("max_new_tokens", 16))
    store: dict[str, list] = {}
    with Patch() as patch:
        _record_prompts(patch, ref, store)

        def generate_text(original, *a, **k):
            tokens = original(*a, **k)
            store["tokens"] = [_np(tokens[:, 0])]
            return tokens

        patch.wrap(ref.model, "generate_text", generate_text)
        patch.hook(ref.model.language_model.lm_head, lambda m, i, o: store.setdefault("step_logits", []).append(_np(o)))
        out = ref.inferencer(
            image=_image(case["image"]),
            text=case["question"],
            understanding_output=True,
            max_think_token_n=max_new + 1,  # the reference's max_length counts the start token
            do_sample=False,
        )
    tokens = store["tokens"][0].astype(np.int64)
    arrays = {
        "prompt_ids": store["prompt_ids"][-1].astype(np.int64),
        "vit_pixel_rows": store["vit_pixel_rows"][0],
        "vit_position_ids": store["vit_position_ids"][0].astype(np.int64),
        "tokens": tokens,
        "new_tokens": tokens[1:],
        "step_logits": np.concatenate(store["step_logits"], axis=0),
        "text": np.array(out["text"]),
    }
    return arrays, {"text": out["text"], "new_tokens": tokens[1:].tolist()}


def run_generation(
    ref: Reference, case: dict[str, Any], defaults: dict[str, Any], seed: int
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    params = flow_params(case, defaults)
    edit = case["kind"] == "edit"
    vae_mean = bool(case.get("vae_mean", defaults["vae_mean"]))
    store: dict[str, list] = {}
    steps: list[dict[str, np.ndarray]] = []
    noise_file = case.get("noise")
    with Patch() as patch:
        _record_prompts(patch, ref, store)
        if edit and vae_mean:
            patch.set(ref.vae_model.reg, "sample", False)  # DiagonalGaussian returns the posterior mean

        def encode(original, x):
            z = original(x)
            store.setdefault("vae_input", []).append(_np(x))
            store.setdefault("context_latent", []).append(_np(z))
            return z

        patch.wrap(ref.vae_model, "encode", encode)

        def prepare_vae_latent(original, *a, **k):
            torch.manual_seed(seed)  # the reference draws the noise with the global RNG in here
            generation_input = original(*a, **k)
            if noise_file:
                given = torch.from_numpy(np.load(noise_file)).float()
                if given.shape != generation_input["packed_init_noises"].shape:
                    raise ValueError(
                        f"noise {noise_file}: shape {tuple(given.shape)}, the reference needs "
                        f"{tuple(generation_input['packed_init_noises'].shape)}"
                    )
                generation_input["packed_init_noises"] = given
            store["noise"] = [_np(generation_input["packed_init_noises"])]
            return generation_input

        patch.wrap(ref.model, "prepare_vae_latent", prepare_vae_latent)

        def gen_image(original, image_shape, gen_context, **k):
            contexts = (gen_context, k["cfg_text_precontext"], k["cfg_img_precontext"])
            store["kv_lens"] = [np.array([c["kv_lens"][0] for c in contexts], dtype=np.int64)]
            store["ropes"] = [np.array([c["ropes"][0] for c in contexts], dtype=np.int64)]
            store["image_shape"] = [np.array(image_shape, dtype=np.int64)]
            return original(image_shape, gen_context, **k)

        patch.wrap(ref.inferencer, "gen_image", gen_image)
        branch_outputs: list[torch.Tensor] = []
        patch.hook(ref.model.llm2vae, lambda m, i, o: branch_outputs.append(o.detach().clone()))

        def forward_flow(original, **k):
            branch_outputs.clear()
            v = original(**k)
            index = k["packed_vae_token_indexes"]
            ran = [True, k["cfg_text_scale"] > 1.0, k["cfg_img_scale"] > 1.0]
            outs = iter(branch_outputs)
            nan = torch.full_like(v, float("nan"))
            cond, text, img = (next(outs)[index] if r else nan for r in ran)
            steps.append(
                {
                    "x": _np(k["x_t"]),
                    "t": np.float32(k["timestep"][0]),
                    "v": _np(v),
                    "v_cond": _np(cond),
                    "v_cfg_text": _np(text),
                    "v_cfg_img": _np(img),
                    "text_scale": np.float32(k["cfg_text_scale"]),
                    "img_scale": np.float32(k["cfg_img_scale"]),
                }
            )
            return v

        patch.wrap(ref.model, "_forward_flow", forward_flow)

        def generate_image(original, **k):
            latents = original(**k)
            store["latent"] = [_np(latents[0])]
            return latents

        patch.wrap(ref.model, "generate_image", generate_image)
        torch.manual_seed(seed)  # the edit context's VAE sample (when not --vae-mean) draws here
        kwargs = dict(params)
        if not edit:
            kwargs["image_shapes"] = (int(case["height"]), int(case["width"]))
        out = ref.inferencer(image=_image(case["image"]) if edit else None, text=case["prompt"], **kwargs)
    latent = store["latent"][0]
    arrays = {
        "noise": store["noise"][0],
        "timesteps": np.array([s["t"] for s in steps], dtype=np.float32),
        "x": np.stack([s["x"] for s in steps] + [latent]),
        "v": np.stack([s["v"] for s in steps]),
        "v_cond": np.stack([s["v_cond"] for s in steps]),
        "v_cfg_text": np.stack([s["v_cfg_text"] for s in steps]),
        "v_cfg_img": np.stack([s["v_cfg_img"] for s in steps]),
        "cfg_text_scale_used": np.array([s["text_scale"] for s in steps], dtype=np.float32),
        "cfg_img_scale_used": np.array([s["img_scale"] for s in steps], dtype=np.float32),
        "latent": latent,
        "image": np.asarray(out["image"], dtype=np.uint8),
        "image_shape": store["image_shape"][0],
        "prompt_ids": store["prompt_ids"][-1].astype(np.int64),
        "kv_lens": store["kv_lens"][0],
        "ropes": store["ropes"][0],
    }
    if edit:
        arrays.update(
            vae_input=store["vae_input"][0],
            context_latent=store["context_latent"][0],
            vit_pixel_rows=store["vit_pixel_rows"][0],
            vit_position_ids=store["vit_position_ids"][0].astype(np.int64),
        )
    summary = {
        **params,
        "seed": seed,
        "noise": noise_file or "torch.randn after torch.manual_seed(seed)",
        "image_shape": arrays["image_shape"].tolist(),
        "kv_lens(gen,cfg_text,cfg_img)": arrays["kv_lens"].tolist(),
        "ropes(gen,cfg_text,cfg_img)": arrays["ropes"].tolist(),
    }
    if edit:
        summary["vae_context"] = "mean" if vae_mean else "sample (mean + std * randn, seeded)"
    return arrays, summary


def _capture_llm(patch: Patch, ref: Reference, store: dict[str, list]) -> None:
    def forward_inference(original, **k):
        store.setdefault("llm_in", []).append(k)
        output = original(**k)
        store.setdefault("llm_out", []).append(_np(output.packed_query_sequence))
        return output

    patch.wrap(ref.model.language_model, "forward_inference", forward_inference)


def run_probe(ref: Reference, case: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    model, arrays = ref.model, {}
    layers = model.config.llm_config.num_hidden_layers
    if "image" in case:
        image = _image(case["image"])
        store: dict[str, list] = {}
        with Patch() as patch:
            _capture_llm(patch, ref, store)
            generation_input, _, _ = model.prepare_vit_images([0], [0], [image], ref.vit_transform, ref.new_token_ids)
            model.forward_cache_update_vit(ref.naive_cache(layers), **generation_input)
        rows = store["llm_in"][0]["packed_query_sequence"][generation_input["packed_vit_token_indexes"]]
        arrays.update(
            vit_pixels=_np(ref.vit_transform(image)),
            vit_pixel_rows=_np(generation_input["packed_vit_tokens"]),
            vit_position_ids=_np(generation_input["packed_vit_position_ids"]).astype(np.int64),
            vit_rows=_np(rows),
            vit_span_out=store["llm_out"][0],
        )
        store = {}
        with Patch() as patch:
            _capture_llm(patch, ref, store)
            patch.set(ref.vae_model.reg, "sample", False)
            patch.hook(model.vae2llm, lambda m, i: store.setdefault("tokens", []).append(_np(i[0])), pre=True)
            generation_input, _, _ = model.prepare_vae_images([0], [0], [image], ref.vae_transform, ref.new_token_ids)
            model.forward_cache_update_vae(ref.vae_model, ref.naive_cache(layers), **generation_input)
            pixels = generation_input["padded_images"]
            latent = ref.vae_model.encode(pixels)
            decoded = ref.vae_model.decode(latent)
        tokens = store["tokens"][0]
        rows = store["llm_in"][0]["packed_query_sequence"][generation_input["packed_vae_token_indexes"]]
        arrays.update(
            vae_pixels=_np(pixels),
            vae_latent_mean=_np(latent),
            vae_tokens=tokens,
            vae_rows=_np(rows),
            vae_span_out=store["llm_out"][0],
            vae_decoded=_np(decoded),
            vae_decoded_image=np.asarray(
                ref.inferencer.decode_image(torch.from_numpy(tokens), tuple(pixels.shape[2:])), dtype=np.uint8
            ),
        )
    if "text" in case:
        store = {}
        with Patch() as patch:
            _capture_llm(patch, ref, store)
            for layer in model.language_model.model.layers:
                patch.hook(layer, lambda m, i, o: store.setdefault("layers", []).append(_np(o[0])))
            generation_input, _, _ = model.prepare_prompts([0], [0], [case["text"]], ref.tokenizer, ref.new_token_ids)
            cache = model.forward_cache_update_text(ref.naive_cache(layers), **generation_input)
        final = torch.from_numpy(store["llm_out"][0])
        arrays.update(
            text_ids=_np(generation_input["packed_text_ids"]).astype(np.int64),
            text_positions=_np(generation_input["packed_text_position_ids"]).astype(np.int64),
            text_embeds=_np(store["llm_in"][0]["packed_query_sequence"]),
            text_layers=np.stack(store["layers"]),
            text_final=store["llm_out"][0],
            text_logits=_np(model.language_model.lm_head(final)),
            text_k=np.stack([_np(cache.key_cache[i]) for i in range(layers)]),
            text_v=np.stack([_np(cache.value_cache[i]) for i in range(layers)]),
        )
    return arrays, {"keys": sorted(arrays)}


# ---------------------------------------------------------------- command line


def cases_from_args(args: argparse.Namespace) -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []
    if args.cases:
        path = Path(args.cases)
        cases += load_cases(json.loads(path.read_text()), path.parent)
    image = str(Path(args.image).resolve()) if args.image else None
    needs_image = [flag for flag, value in (("--understand", args.understand), ("--edit", args.edit)) if value]
    if needs_image and not image:
        raise SystemExit(f"{', '.join(needs_image)} need --image")
    if args.understand:
        cases.append(
            {
                "kind": "understand",
                "name": "und",
                "image": image,
                "question": args.understand,
                "max_new_tokens": args.max_new_tokens,
            }
        )
    if args.t2i:
        cases.append({"kind": "t2i", "name": "t2i", "prompt": args.t2i, "height": args.height, "width": args.width})
    if args.edit:
        cases.append({"kind": "edit", "name": "edit", "image": image, "prompt": args.edit})
    if args.probe_text or (image and args.probe_image):
        probe = {"kind": "probe", "name": "probe"}
        if args.probe_image and image:
            probe["image"] = image
        if args.probe_text:
            probe["text"] = args.probe_text
        cases.append(probe)
    if not cases:
        raise SystemExit("nothing to run: give --cases or at least one of --understand/--t2i/--edit/--probe-text")
    names = [c["name"] for c in cases]
    if len(set(names)) != len(names):
        raise SystemExit(f"case names repeat: {names}")
    return cases


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog='Case file: {"cases": [{"kind": "understand", "name": "und", "image": "a.png", '
        '"question": "...", "max_new_tokens": 8}, {"kind": "t2i", "prompt": "...", "height": 64, '
        '"width": 64, "num_timesteps": 4, "cfg_text_scale": 4.0, "noise": "n.npy"}, {"kind": "edit", '
        '"image": "a.png", "prompt": "...", "vae_mean": true}, {"kind": "probe", "image": "a.png", '
        '"text": "..."}]} -- paths relative to the file; flow fields default to the flags below; an optional '
        'per-case "seed". The npz keys are listed in this tool\'s module docstring.',
    )
    p.add_argument("--bagel-src", required=True, type=Path, help="checkout of github.com/ByteDance-Seed/Bagel")
    p.add_argument("--checkpoint", required=True, type=Path, help="checkpoint dir in BAGEL's released layout")
    p.add_argument("--out", required=True, type=Path, help="output .npz (a .json summary is written beside it)")
    p.add_argument("--cases", help="JSON case file (see below)")
    p.add_argument("--image", help="PNG/JPEG used by --understand, --edit and the image probe")
    p.add_argument("--understand", metavar="QUESTION", help="understanding case: greedy answer about --image")
    p.add_argument("--max-new-tokens", type=int, default=16, help="answer tokens for --understand (default 16)")
    p.add_argument("--t2i", metavar="PROMPT", help="text-to-image case")
    p.add_argument("--height", type=int, default=None, help="t2i height (default min(1024, max_latent_size*16))")
    p.add_argument("--width", type=int, default=None, help="t2i width (default as --height)")
    p.add_argument("--edit", metavar="INSTRUCTION", help="editing case on --image")
    p.add_argument("--probe-text", metavar="TEXT", help="probe: LLM hidden states of this text's prefill")
    p.add_argument(
        "--no-probe-image", dest="probe_image", action="store_false", help="skip the ViT/VAE probe of --image"
    )
    p.add_argument("--seed", type=int, default=0, help="torch seed before each case and before the noise draw")
    p.add_argument(
        "--vae-mean", action="store_true", help="edit: VAE-encode the context image to its mean (not sampled)"
    )
    p.add_argument("--num-timesteps", type=int, default=FLOW_DEFAULTS["num_timesteps"])
    p.add_argument("--timestep-shift", type=float, default=FLOW_DEFAULTS["timestep_shift"])
    p.add_argument("--cfg-text-scale", type=float, default=FLOW_DEFAULTS["cfg_text_scale"])
    p.add_argument("--cfg-img-scale", type=float, default=FLOW_DEFAULTS["cfg_img_scale"])
    p.add_argument(
        "--cfg-interval", type=float, nargs=2, default=FLOW_DEFAULTS["cfg_interval"], metavar=("LOW", "HIGH")
    )
    p.add_argument(
        "--cfg-renorm-type", default=FLOW_DEFAULTS["cfg_renorm_type"], choices=["global", "channel", "text_channel"]
    )
    p.add_argument("--cfg-renorm-min", type=float, default=FLOW_DEFAULTS["cfg_renorm_min"])
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--allow-key-mismatch", action="store_true", help="run even if checkpoint keys do not match")
    p.add_argument(
        "--json-tokenizer",
        action="store_true",
        help="read tokenizer.json even where vocab.json + merges.txt exist: the reference's slow Qwen2Tokenizer "
        "fails to decode ids of the embedding table's padding rows (which random weights can sample)",
    )
    return p


def _finite(arrays: dict[str, np.ndarray]) -> dict[str, bool]:
    # NaN marks skipped CFG branches on purpose: those arrays are checked for inf only
    return {
        k: bool(np.isfinite(a).all() if not k.startswith("v_cfg") else not np.isinf(a).any())
        for k, a in arrays.items()
        if a.dtype.kind == "f"
    }


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cases = cases_from_args(args)
    start = time.monotonic()
    print(f"building the reference from {args.bagel_src} on {args.checkpoint} ...", flush=True)
    ref = load_reference(
        args.bagel_src, args.checkpoint, allow_key_mismatch=args.allow_key_mismatch, json_tokenizer=args.json_tokenizer
    )
    summary: dict[str, Any] = {"build": ref.report, "build_s": round(time.monotonic() - start, 2), "cases": {}}
    print(
        f"built in {summary['build_s']} s; stubs {ref.report['stubs']}; tokenizer: {ref.report['tokenizer']}",
        flush=True,
    )
    side = min(1024, ref.model.max_latent_size * ref.model.latent_downsample)
    defaults = {
        name: getattr(args, name) for name in ("num_timesteps", "timestep_shift", "cfg_text_scale", "cfg_img_scale")
    }
    defaults.update(
        cfg_interval=list(args.cfg_interval),
        cfg_renorm_type=args.cfg_renorm_type,
        cfg_renorm_min=args.cfg_renorm_min,
        vae_mean=args.vae_mean,
    )
    out: dict[str, np.ndarray] = {}
    for case in cases:
        name, kind = case["name"], case["kind"]
        seed = int(case.get("seed", args.seed))
        print(f"[{name}] {kind} ...", flush=True)
        begin = time.monotonic()
        torch.manual_seed(seed)
        if kind == "understand":
            arrays, info = run_understand(ref, case)
        elif kind == "probe":
            arrays, info = run_probe(ref, case)
        else:
            if kind == "t2i":
                case = {
                    **case,
                    "height": case.get("height") or side,
                    "width": case.get("width") or case.get("height") or side,
                }
            arrays, info = run_generation(ref, case, defaults, seed)
        seconds = round(time.monotonic() - begin, 2)
        finite = _finite(arrays)
        info.update(
            kind=kind,
            seconds=seconds,
            all_finite=all(finite.values()),
            not_finite=[k for k, ok in finite.items() if not ok],
        )
        info["shapes"] = {k: list(a.shape) for k, a in arrays.items()}
        summary["cases"][name] = info
        out.update({f"{name}/{k}": a for k, a in arrays.items()})
        print(f"[{name}] done in {seconds} s, all finite: {info['all_finite']}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(args.out, **out)
    summary_path = args.out.with_suffix(".json")
    summary_path.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(f"wrote {args.out} ({len(out)} arrays) and {summary_path}", flush=True)
    return 0 if all(c["all_finite"] for c in summary["cases"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
