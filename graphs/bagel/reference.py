"""A naive dense reference of BAGEL's LLM and its recipes, for parity tests.

Written from the facts of the reference implementation (``qwen2_navit.py``, ``bagel.py``), sharing
no code with ``llm.py`` / ``mot_layer.py`` / ``guidance.py``: it works on the raw
``ema.safetensors`` state dict and an :class:`LlmConfig`, in fp32, recomputing the whole context at
every step (no KV cache) with one explicit [T, T] mask: key j is visible to query i iff j <= i or
both lie in the same image span. Each weight is applied to every row with both sets, and each row
keeps its own set's result (und, or gen for VAE latent rows).

A context is a list of parts, in order:

- ``("text", ids)``: token rows, causal, rope positions r, r+1, ...;
- ``("und_rows", embeds [N, Hd])``: an understanding image span (ViT rows);
- ``("gen_rows", embeds [N, Hd])``: a generation image span (embedded VAE latent tokens).

An image span is ``<|vision_start|>`` + its N rows + ``<|vision_end|>``, all N+2 rows at one rope
position, the counter then + 1; its markers are understanding rows. ``markers`` is the pair of
(vision_start, vision_end) ids.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mstar_graphs.bagel.config import LlmConfig

Part = tuple[str, Any]
Markers = tuple[int, int]
LM = "language_model.model."


@dataclass
class RefRows:
    """A context laid out row by row: what each row is and where it sits."""

    ids: torch.Tensor  # [T] token ids (0 on embedded rows)
    embeds: torch.Tensor  # [T, Hd] the given rows (zeros elsewhere)
    embed_mask: torch.Tensor  # [T] bool: row comes from ``embeds``
    rope: torch.Tensor  # [T] rope positions
    gen: torch.Tensor  # [T] bool: generation (VAE latent) row
    span: torch.Tensor  # [T] image span index, -1 outside images


def ref_layout(parts: Sequence[Part], markers: Markers, hidden: int) -> RefRows:
    ids: list[int] = []
    rope: list[int] = []
    gen: list[bool] = []
    span: list[int] = []
    marked: list[bool] = []  # the row is taken from the part's embeds
    given: list[torch.Tensor] = []  # one [1, Hd] per row
    counter, spans = 0, 0
    zero = torch.zeros(1, hidden)
    for kind, value in parts:
        if kind == "text":
            for tid in list(value):
                ids.append(int(tid))
                rope.append(counter)
                counter += 1
                gen.append(False)
                span.append(-1)
                marked.append(False)
                given.append(zero)
        elif kind in ("und_rows", "gen_rows"):
            rows = torch.as_tensor(value, dtype=torch.float32)
            n = rows.shape[0]
            ids += [markers[0], *([0] * n), markers[1]]
            rope += [counter] * (n + 2)
            gen += [False, *([kind == "gen_rows"] * n), False]
            span += [spans] * (n + 2)
            marked += [False, *([True] * n), False]
            given += [zero, *rows.split(1), zero]
            counter += 1
            spans += 1
        else:
            raise ValueError(f"unknown context part {kind!r} (text, und_rows, gen_rows)")
    return RefRows(
        ids=torch.tensor(ids, dtype=torch.long),
        embeds=torch.cat(given) if given else torch.zeros(0, hidden),
        embed_mask=torch.tensor(marked, dtype=torch.bool),
        rope=torch.tensor(rope, dtype=torch.long),
        gen=torch.tensor(gen, dtype=torch.bool),
        span=torch.tensor(span, dtype=torch.long),
    )


def ref_mask(rows: RefRows) -> torch.Tensor:
    """[T, T] bool, query by key: causal, plus everything inside the query's own image span."""
    t = rows.span.shape[0]
    causal = torch.ones(t, t).tril().bool()
    same_span = (rows.span[:, None] == rows.span[None, :]) & (rows.span[:, None] >= 0)
    return causal | same_span


def _rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rotate(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """HF rotate-half RoPE on x [T, heads, D] at positions pos [T]."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    angles = pos.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([angles, angles], dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    rotated = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], dim=-1)
    return x * cos + rotated * sin


def _per_kind(gen: torch.Tensor, und_value: torch.Tensor, gen_value: torch.Tensor) -> torch.Tensor:
    shape = (-1,) + (1,) * (und_value.dim() - 1)
    return torch.where(gen.reshape(shape), gen_value, und_value)


def ref_hidden(sd: Mapping[str, torch.Tensor], cfg: LlmConfig, parts: Sequence[Part], markers: Markers) -> torch.Tensor:
    """Final-normed hidden states [T, Hd] of every row of the context (markers included)."""
    rows = ref_layout(parts, markers, cfg.hidden_size)
    return ref_hidden_rows(sd, cfg, rows)


def ref_hidden_rows(sd: Mapping[str, torch.Tensor], cfg: LlmConfig, rows: RefRows) -> torch.Tensor:
    w = {k: v.float() for k, v in sd.items()}
    x = w[LM + "embed_tokens.weight"][rows.ids]
    x = torch.where(rows.embed_mask[:, None], rows.embeds.float(), x)
    visible = ref_mask(rows)
    for n in range(cfg.num_hidden_layers):
        x = _ref_layer(w, cfg, f"{LM}layers.{n}.", x, rows, visible)
    eps = cfg.rms_norm_eps
    return _per_kind(rows.gen, _rmsnorm(x, w[LM + "norm.weight"], eps), _rmsnorm(x, w[LM + "norm_moe_gen.weight"], eps))


def _ref_layer(
    w: Mapping[str, torch.Tensor], cfg: LlmConfig, p: str, x: torch.Tensor, rows: RefRows, visible: torch.Tensor
) -> torch.Tensor:
    """One MoT decoder layer (weights under prefix ``p``) over all rows at once."""
    eps, nh, nkv = cfg.rms_norm_eps, cfg.num_attention_heads, cfg.num_key_value_heads
    t, d = x.shape[0], cfg.hidden_size // nh

    def both(name: str, fn: Callable[[str], torch.Tensor]) -> torch.Tensor:
        """fn applied with the und weight ``name`` and with its gen twin; each row keeps its own."""
        return _per_kind(rows.gen, fn(name), fn(name + "_moe_gen"))

    def norm(name: str, value: torch.Tensor) -> torch.Tensor:
        return both(name, lambda s: _rmsnorm(value, w[f"{p}{s}.weight"], eps))

    h = norm("input_layernorm", x)

    def proj(s: str, heads: int) -> torch.Tensor:
        return (h @ w[f"{p}self_attn.{s}.weight"].T + w[f"{p}self_attn.{s}.bias"]).view(t, heads, d)

    q = both("q_proj", lambda s: proj(s, nh))
    k = both("k_proj", lambda s: proj(s, nkv))
    v = both("v_proj", lambda s: proj(s, nkv))
    q, k = norm("self_attn.q_norm", q), norm("self_attn.k_norm", k)
    q, k = _rotate(q, rows.rope, cfg.rope_theta), _rotate(k, rows.rope, cfg.rope_theta)
    group = nh // nkv
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * d**-0.5
    scores = scores.masked_fill(~visible[None], float("-inf"))
    attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(t, nh * d)
    x = x + both("self_attn.o_proj", lambda s: attn @ w[f"{p}{s}.weight"].T)
    h = norm("post_attention_layernorm", x)

    def mlp(s: str) -> torch.Tensor:
        gate = torch.nn.functional.silu(h @ w[f"{p}{s}.gate_proj.weight"].T)
        return (gate * (h @ w[f"{p}{s}.up_proj.weight"].T)) @ w[f"{p}{s}.down_proj.weight"].T

    return x + both("mlp", mlp)


def ref_logits(sd: Mapping[str, torch.Tensor], hidden: torch.Tensor) -> torch.Tensor:
    return hidden @ sd["language_model.lm_head.weight"].float().T


def ref_velocity(sd: Mapping[str, torch.Tensor], hidden: torch.Tensor) -> torch.Tensor:
    return hidden @ sd["llm2vae.weight"].float().T + sd["llm2vae.bias"].float()


@dataclass
class RefText:
    tokens: list[int]  # as Bagel.generate_text returns them: <|im_start|> first, <|im_end|> not included
    text: str  # the decoded text between <|im_start|> and <|im_end|>


def ref_understand(
    sd: Mapping[str, torch.Tensor], cfg: LlmConfig, tok: Any, parts: Sequence[Part], max_new_tokens: int
) -> RefText:
    """Greedy decoding after ``parts``, as ``Bagel.generate_text``: the first query is ``<|im_start|>`` at the
    context's next rope position; stop when the new token is ``<|im_end|>`` or after ``max_new_tokens``
    steps (the reference's ``max_length``: the start token counts as one)."""
    special = tok.special
    markers = (special.vision_start, special.vision_end)
    tokens: list[int] = []
    current = special.im_start
    for _ in range(max_new_tokens):
        tokens.append(current)
        hidden = ref_hidden(sd, cfg, [*parts, ("text", tokens)], markers)
        current = int(ref_logits(sd, hidden[-1:]).argmax(-1))
        if current == special.im_end:
            break
    text = tok.decode(tokens).split("<|im_end|>")[0].split("<|im_start|>")[1]
    return RefText(tokens=tokens, text=text)


# ------------------------------------------------------------------ generation


def ref_timesteps(steps: int, shift: float) -> torch.Tensor:
    u = torch.linspace(1, 0, steps)
    return shift * u / (1 + (shift - 1) * u)


def ref_combine(
    v_c: torch.Tensor,
    v_t: torch.Tensor | None,
    v_i: torch.Tensor | None,
    text_scale: float,
    img_scale: float,
    renorm: str,
    renorm_min: float,
) -> torch.Tensor:
    """The end of ``_forward_flow``, with the scales already gated (1.0 outside the interval)."""
    if not text_scale > 1.0:
        return v_c
    assert v_t is not None
    text_v = v_t + text_scale * (v_c - v_t)
    if renorm == "text_channel":
        k = (v_c.norm(dim=-1, keepdim=True) / (text_v.norm(dim=-1, keepdim=True) + 1e-8)).clamp(min=renorm_min, max=1.0)
        text_v = text_v * k
        if img_scale > 1.0:
            assert v_i is not None
            return v_i + img_scale * (text_v - v_i)
        return text_v
    out = v_i + img_scale * (text_v - v_i) if img_scale > 1.0 else text_v
    if renorm == "global":
        k = v_c.norm() / (out.norm() + 1e-8)
    elif renorm == "channel":
        k = v_c.norm(dim=-1, keepdim=True) / (out.norm(dim=-1, keepdim=True) + 1e-8)
    else:
        raise NotImplementedError(renorm)
    return out * k.clamp(min=renorm_min, max=1.0)


def ref_gated_scales(t: torch.Tensor, params: Any) -> tuple[float, float]:
    """(text, image) scale at ``t`` (fp32 tensor): the given ones inside ``lo < t <= hi``, else 1.0."""
    lo, hi = params.interval
    if t > lo and t <= hi:
        return float(params.text_scale), float(params.image_scale)
    return 1.0, 1.0


def _branch_velocity(
    sd: Mapping[str, torch.Tensor], cfg: LlmConfig, parts: Sequence[Part], markers: Markers, n: int
) -> torch.Tensor:
    """The velocity of the last part's n latent rows (its span's end marker excluded)."""
    hidden = ref_hidden(sd, cfg, parts, markers)
    return ref_velocity(sd, hidden[-(n + 1) : -1])


def ref_generate_latents(
    sd: Mapping[str, torch.Tensor],
    cfg: LlmConfig,
    contexts: Mapping[str, Sequence[Part]],
    noise: torch.Tensor,
    embed_latent: Callable[[torch.Tensor, float], torch.Tensor],
    params: Any,
    markers: Markers,
) -> list[torch.Tensor]:
    """Euler flow from ``noise`` [N, p*p*C] with guidance; ``contexts`` maps gen / cfg_text / cfg_img to
    their parts (a branch whose scale is off may be missing); ``embed_latent(x, t) -> [N, Hd]`` embeds
    the latent tokens at time t; ``params`` carries steps, timestep_shift, text_scale, image_scale,
    interval, renorm, renorm_min. Returns x after every step (steps - 1 tensors)."""
    times = ref_timesteps(params.steps, params.timestep_shift)
    x = noise.float().clone()
    n = x.shape[0]
    out = []
    for i in range(params.steps - 1):
        t = times[i]
        text_scale, img_scale = ref_gated_scales(t, params)
        latent = ("gen_rows", embed_latent(x, float(t)))
        v_c = _branch_velocity(sd, cfg, [*contexts["gen"], latent], markers, n)
        v_t = _branch_velocity(sd, cfg, [*contexts["cfg_text"], latent], markers, n) if text_scale > 1.0 else None
        v_i = _branch_velocity(sd, cfg, [*contexts["cfg_img"], latent], markers, n) if img_scale > 1.0 else None
        v = ref_combine(v_c, v_t, v_i, text_scale, img_scale, params.renorm, params.renorm_min)
        x = x - v * (times[i] - times[i + 1])
        out.append(x)
    return out


# ------------------------------------------------------------------ think mode


def ref_think_contexts(
    sd: Mapping[str, torch.Tensor],
    cfg: LlmConfig,
    tok: Any,
    inputs: Sequence[tuple[str, Any]],
    system_prompt: str,
    max_think_tokens: int,
) -> tuple[RefText, dict[str, list[Part]]]:
    """The thought and the three contexts a thinking generation ends with, built input by input as
    ``InterleaveInferencer.interleave_inference(think=True)`` builds them. ``inputs``: ``("text", str)`` or
    ``("image", [its parts])`` in order. The system prompt opens the full and the no-image contexts; a text
    input first copies the full context to the no-text one; an image's parts go to the full context only,
    which the no-text one then copies. The thought is decoded greedily from the full context, and its text
    re-tokenized as one more text turn of the full context."""
    system = ("text", tok.text_turn(system_prompt))
    gen: list[Part] = [system]
    no_image: list[Part] = [system]
    no_text: list[Part] = []
    for kind, value in inputs:
        if kind == "text":
            no_text = list(gen)
            gen.append(("text", tok.text_turn(value)))
            no_image.append(("text", tok.text_turn(value)))
        elif kind == "image":
            gen.extend(value)
            no_text = list(gen)
        else:
            raise ValueError(f"unknown input {kind!r} (text, image)")
    thought = ref_understand(sd, cfg, tok, gen, max_think_tokens)
    gen.append(("text", tok.text_turn(thought.text)))
    return thought, {"gen": gen, "cfg_text": no_text, "cfg_img": no_image}


# ------------------------------------------------------------------ interleaved inputs


def ref_interleave_contexts(
    tok: Any, inputs: Sequence[tuple[str, Any]], *, understanding: bool = False
) -> dict[str, list[Part]]:
    """The contexts ``InterleaveInferencer.interleave_inference(input_lists)`` (no think) has built when it
    starts to answer or to generate, input by input. ``inputs``: ``("text", str)`` or ``("image", (vae rows,
    vit rows))`` in order (``vae rows`` may be None for understanding). A text first copies the full context
    to the no-text one, then goes to the full and the no-image contexts; an image goes to the full context
    only (its VAE span unless ``understanding``, then its ViT span), then the no-text one copies the full."""
    gen: list[Part] = []
    no_text: list[Part] = []
    no_image: list[Part] = []
    for kind, value in inputs:
        if kind == "text":
            no_text = list(gen)
            gen.append(("text", tok.text_turn(value)))
            no_image.append(("text", tok.text_turn(value)))
        elif kind == "image":
            vae_rows, vit_rows = value
            if not understanding:
                gen.append(("gen_rows", vae_rows))
            gen.append(("und_rows", vit_rows))
            no_text = list(gen)
        else:
            raise ValueError(f"unknown input {kind!r} (text, image)")
    return {"gen": gen, "cfg_text": no_text, "cfg_img": no_image}
