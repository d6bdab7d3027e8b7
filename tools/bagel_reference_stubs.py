"""The stand-ins that let ByteDance-Seed's BAGEL code import and run on a CPU in float32 (for
tools/bagel_reference_run.py; nothing here is used by the product).

- ``flash_attn.flash_attn_varlen_func``: ``varlen_attention``, an exact fp32 equivalent (per sequence of
  ``cu_seqlens``, GQA head mapping, bottom-right aligned causal mask when the lengths differ);
- ``torchvision`` / ``cv2`` for ``data/transforms.py`` only (a size-only resize; removed after the import);
- the reference's unconditional ``torch.bfloat16`` casts redirected to float32 inside its two modules;
- transformers 5's missing default RoPE and unset token ids (the reference was written for 4.x);
- ``app_configs``: ``llm_config`` / ``vit_config`` with app.py's overrides.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
) -> torch.Tensor:
    """Exact float32 ``flash_attn_varlen_func``: ``q [Tq, Hq, D]``, ``k, v [Tk, Hkv, D]`` -> ``[Tq, Hq, D]``.

    Sequences (from the prefix sums) are independent; q head h reads kv head h // (Hq // Hkv); with
    ``causal`` query i of a sequence sees key j iff j <= i + (Lk - Lq) (flash-attn >= 2.1's
    bottom-right alignment); a query row that sees no key gives zeros, as flash-attn does.
    """
    if q.dim() != 3 or k.dim() != 3 or v.shape != k.shape:
        raise ValueError(f"varlen_attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    heads, kv_heads, dim = q.shape[1], k.shape[1], q.shape[2]
    if heads % kv_heads:
        raise ValueError(f"varlen_attention: {heads} query heads not a multiple of {kv_heads} kv heads")
    cq, ck = [int(x) for x in cu_seqlens_q], [int(x) for x in cu_seqlens_k]
    if len(cq) != len(ck):
        raise ValueError(f"varlen_attention: {len(cq) - 1} query sequences but {len(ck) - 1} key sequences")
    scale = dim**-0.5 if softmax_scale is None else softmax_scale
    out = q.new_zeros(q.shape, dtype=torch.float32)
    for (q0, q1), (k0, k1) in zip(zip(cq, cq[1:]), zip(ck, ck[1:])):
        qs = q[q0:q1].float()
        ks = k[k0:k1].float().repeat_interleave(heads // kv_heads, dim=1)
        vs = v[k0:k1].float().repeat_interleave(heads // kv_heads, dim=1)
        scores = torch.einsum("qhd,khd->hqk", qs, ks) * scale
        if causal:
            lq, lk = q1 - q0, k1 - k0
            seen = torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + (lk - lq)
            scores = scores.masked_fill(~seen, float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # fully masked rows -> 0
        out[q0:q1] = torch.einsum("hqk,khd->qhd", probs, vs)
    return out.to(q.dtype)


# ---------------------------------------------------------------- stubs for a CPU import


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.__dict__.update(attrs)
    return module


def _flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q=None,
    max_seqlen_k=None,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
):
    if dropout_p or tuple(window_size) != (-1, -1) or softcap or alibi_slopes is not None or return_attn_probs:
        raise NotImplementedError("flash_attn stub: only plain (dropout-free, full-window) attention")
    return varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=causal, softmax_scale=softmax_scale)


def _torchvision_stub() -> dict[str, types.ModuleType]:
    import enum

    from PIL import Image

    class InterpolationMode(enum.Enum):
        NEAREST = "nearest"
        BILINEAR = "bilinear"
        BICUBIC = "bicubic"
        LANCZOS = "lanczos"

    pil_filter = {
        InterpolationMode.NEAREST: Image.NEAREST,
        InterpolationMode.BILINEAR: Image.BILINEAR,
        InterpolationMode.BICUBIC: Image.BICUBIC,
        InterpolationMode.LANCZOS: Image.LANCZOS,
    }

    def resize(img, size, interpolation=InterpolationMode.BILINEAR, max_size=None, antialias=True):
        if not isinstance(img, Image.Image):
            raise TypeError("torchvision stub: resize supports PIL images only")
        height, width = size
        if img.size == (width, height):
            return img  # torchvision returns the input unchanged when no resize is needed
        return img.resize((width, height), pil_filter[interpolation])

    class ToTensor:
        def __call__(self, pic):
            if not isinstance(pic, Image.Image):
                raise TypeError("torchvision stub: ToTensor supports PIL images only")
            array = np.array(pic, copy=True)
            if array.ndim == 2:
                array = array[:, :, None]
            return torch.from_numpy(array).permute(2, 0, 1).contiguous().float().div(255)

    class Normalize:
        def __init__(self, mean, std, inplace=False):
            self.mean, self.std = torch.tensor(mean)[:, None, None], torch.tensor(std)[:, None, None]

        def __call__(self, tensor):
            return (tensor - self.mean) / self.std

    functional = _module("torchvision.transforms.functional", resize=resize, InterpolationMode=InterpolationMode)
    transforms = _module(
        "torchvision.transforms",
        functional=functional,
        InterpolationMode=InterpolationMode,
        ToTensor=ToTensor,
        Normalize=Normalize,
    )
    root = _module("torchvision", transforms=transforms)
    return {"torchvision": root, "torchvision.transforms": transforms, "torchvision.transforms.functional": functional}


def install_import_stubs() -> list[str]:
    """Put the ``flash_attn`` stub into ``sys.modules`` (always: a real one would need CUDA); returns its name."""
    sys.modules["flash_attn"] = _module("flash_attn", flash_attn_varlen_func=_flash_attn_varlen_func)
    return ["flash_attn"]


def import_image_transform() -> tuple[Any, list[str]]:
    """``data.transforms.ImageTransform``, with torchvision/cv2 stubbed only for that import where absent.

    The stubs leave ``sys.modules`` again afterwards: transformers probes for torchvision and would
    import parts of the real one that a stub does not have.
    """
    stubs: dict[str, types.ModuleType] = {}
    for name in ("torchvision", "cv2"):
        try:
            __import__(name)
        except ImportError:
            stubs.update(_torchvision_stub() if name == "torchvision" else {"cv2": _module("cv2")})
    sys.modules.update(stubs)
    try:
        from data.transforms import ImageTransform
    finally:
        for name in stubs:
            sys.modules.pop(name, None)
    return ImageTransform, sorted(stubs)


class _Float32Torch(types.ModuleType):
    """``torch`` as seen by a reference module, except that ``torch.bfloat16`` is float32."""

    bfloat16 = torch.float32

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def redirect_bf16_casts(*modules: types.ModuleType) -> None:
    for module in modules:
        module.torch = _Float32Torch("torch")


# ---------------------------------------------------------------- building the reference

# attributes transformers 4.x configs always had and the reference reads; 5.x sets them only if given
TRANSFORMERS_COMPAT = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}


def _default_rope(config: Any, device: Any = None, seq_len: int | None = None, **_: Any) -> tuple[torch.Tensor, float]:
    """transformers 4.x's ``_compute_default_rope_parameters`` (5.x dropped the "default" entry)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dim = int(head_dim * getattr(config, "partial_rotary_factor", 1.0))
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float().to(device) / dim))
    return inv_freq, 1.0


def install_transformers_compat() -> list[str]:
    """What the reference (written for transformers 4.49) needs from a newer transformers; returns what was added."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    added = []
    if "default" not in ROPE_INIT_FUNCTIONS:
        ROPE_INIT_FUNCTIONS["default"] = _default_rope
        added.append("ROPE_INIT_FUNCTIONS['default'] (4.x inv_freq = 1 / theta^(2i/d))")
    return added


def app_configs(qwen2_config: type, siglip_config: type, ckpt: Path) -> tuple[Any, Any]:
    """``llm_config`` and ``vit_config`` with app.py's overrides (and transformers-5 defaults)."""
    llm_config = qwen2_config.from_json_file(str(ckpt / "llm_config.json"))
    llm_config.qk_norm = True
    llm_config.tie_word_embeddings = False
    llm_config.layer_module = "Qwen2MoTDecoderLayer"
    vit_config = siglip_config.from_json_file(str(ckpt / "vit_config.json"))
    vit_config.rope = False
    vit_config.num_hidden_layers -= 1
    for config in (llm_config, vit_config):
        for name, value in TRANSFORMERS_COMPAT.items():
            if name not in config.__dict__:
                setattr(config, name, value)
    return llm_config, vit_config
