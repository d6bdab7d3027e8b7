"""The other names transformers reads for Qwen3-Omni config fields, turned into the names config.py declares.

transformers' config classes give some fields a second name (each class's ``attribute_map``), and its
``save_pretrained`` writes the second one: the Talker's expert count comes out as ``num_local_experts``.
Hand-written files may use the others (an audio encoder's ``hidden_size`` for ``d_model``). The maps
below are those of transformers 5.25's ``configuration_qwen3_omni_moe.py``; its other classes
(Thinker, Thinker text, code predictor, Code2Wav, the top level) have none.

Files written by transformers 4 (the released checkpoints among them) spell ``rope_parameters``
``rope_scaling``, with ``rope_theta`` beside it rather than inside: read as transformers 5 reads them.
"""

from __future__ import annotations

from typing import Any

# config path -> {the other name: our field}
ALIASES: dict[tuple[str, ...], dict[str, str]] = {
    ("thinker_config", "audio_config"): {
        "num_hidden_layers": "encoder_layers",
        "hidden_size": "d_model",
        "num_attention_heads": "encoder_attention_heads",
        "intermediate_size": "encoder_ffn_dim",
    },
    ("thinker_config", "vision_config"): {"num_attention_heads": "num_heads", "num_hidden_layers": "depth"},
    ("talker_config", "text_config"): {"num_local_experts": "num_experts"},
}
# the configs that carry RoPE parameters (transformers' RotaryEmbeddingConfigMixin)
ROPE_CONFIGS: tuple[tuple[str, ...], ...] = (
    ("thinker_config", "text_config"),
    ("talker_config", "text_config"),
    ("talker_config", "code_predictor_config"),
    ("code2wav_config",),
)


class AliasConflict(ValueError):
    """A field given under two names with different values."""


def canonical_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` (a decoded config.json) with every other name replaced by ours; the input is not changed."""
    out = _copy_dicts(raw)
    for path, aliases in ALIASES.items():
        node = _at(out, path)
        if node is None:
            continue
        for alias, field in aliases.items():
            if alias not in node:
                continue
            value = node.pop(alias)
            if field in node and node[field] != value:
                where = ".".join(path)
                raise AliasConflict(
                    f"{where}.{alias}: {value!r}, but {where}.{field} (the same field, "
                    f"transformers' other name for it) is {node[field]!r}"
                )
            node[field] = value
    for path in ROPE_CONFIGS:
        node = _at(out, path)
        if node is not None:
            _rope_parameters(node)
    return out


def _rope_parameters(node: dict[str, Any]) -> None:
    """transformers 4's ``rope_scaling`` (which transformers 5 prefers when both are there), with the
    ``rope_theta`` written beside it filled in, and its old ``type`` key as ``rope_type``."""
    legacy = node.pop("rope_scaling", None)
    if isinstance(legacy, dict) and legacy:
        node["rope_parameters"] = legacy
    rope = node.get("rope_parameters")
    if not isinstance(rope, dict):
        return
    if "rope_type" not in rope and "type" in rope:
        rope["rope_type"] = rope["type"]
    if "rope_theta" not in rope and node.get("rope_theta") is not None:
        rope["rope_theta"] = node["rope_theta"]


def _at(raw: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any] | None:
    node: Any = raw
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else None


def _copy_dicts(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy_dicts(v) for k, v in value.items()}
    return value
