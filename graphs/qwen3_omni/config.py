"""Qwen3-Omni's config tree, read from a transformers ``config.json`` (model_type ``qwen3_omni_moe``).

Field names are transformers' ``Qwen3OmniMoeConfig`` names so a released checkpoint's config
reads as is, and the other names transformers reads for a field (``num_local_experts``, which its
``save_pretrained`` writes for the Talker's ``num_experts``) are read too: see config_aliases.py.
Unknown fields are ignored. A few values the released model needs are not declared
by the config classes (``head_dim``, the Talker's ``shared_expert_intermediate_size``): they are
read where the checkpoint writes them. Errors name the bad field with its path
(``talker_config.text_config.num_experts_per_tok``).
"""

from __future__ import annotations

import msgspec

from mstar_graphs.common.config_loader import (
    ConfigError,
    JsonConfig,
    convert,
    decode_json,
    field_error,
    require_divides,
    require_positive,
)
from mstar_graphs.qwen3_omni.config_aliases import AliasConflict, canonical_fields


class RopeParameters(msgspec.Struct, kw_only=True):
    rope_type: str = "default"
    rope_theta: float = 10000.0
    mrope_section: list[int] | None = None  # [t, h, w] frequency counts of M-RoPE (sum = head_dim / 2)
    interleaved: bool = False
    mrope_interleaved: bool = False


class TextConfig(msgspec.Struct, kw_only=True):
    """A Qwen3-style decoder: the Thinker's MoE LLM, the Talker's MoE, the code predictor (dense)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int = 0
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_parameters: RopeParameters | None = None
    rope_theta: float | None = None  # transformers 4 spelling
    max_position_embeddings: int = 32768
    hidden_act: str = "silu"
    attention_bias: bool = False
    # MoE (absent for the dense code predictor)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] = msgspec.field(default_factory=list)
    shared_expert_intermediate_size: int = 0  # the Talker's shared expert
    num_code_groups: int = 0  # the code predictor: codebooks per frame

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def theta(self) -> float:
        if self.rope_parameters is not None:
            return float(self.rope_parameters.rope_theta)
        return float(self.rope_theta or 10000.0)

    def is_moe_layer(self, index: int) -> bool:
        """transformers' rule for the Thinker: MoE unless listed dense or off the sparse step."""
        return (
            self.num_experts > 0 and index not in self.mlp_only_layers and (index + 1) % self.decoder_sparse_step == 0
        )


class AudioEncoderConfig(msgspec.Struct, kw_only=True):
    num_mel_bins: int = 128
    encoder_layers: int = 32
    encoder_attention_heads: int = 20
    encoder_ffn_dim: int = 5120
    d_model: int = 1280
    max_source_positions: int = 1500
    n_window: int = 50  # a chunk is 2 * n_window mel frames
    n_window_infer: int = 800  # attention windows of (n_window_infer / (2 n_window)) chunks
    conv_chunksize: int = 500
    downsample_hidden_size: int = 480
    output_dim: int = 3584
    activation_function: str = "gelu"


class VisionEncoderConfig(msgspec.Struct, kw_only=True):
    """The Thinker's vision encoder (transformers' defaults are the released model's)."""

    depth: int = 27
    hidden_size: int = 1152
    hidden_act: str = "gelu_pytorch_tanh"
    intermediate_size: int = 4304
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 16
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    out_hidden_size: int = 3584
    num_position_embeddings: int = 2304  # a learned square grid (48 x 48), resampled to each image's
    deepstack_visual_indexes: list[int] = msgspec.field(default_factory=lambda: [8, 16, 24])
    rope_parameters: RopeParameters = msgspec.field(default_factory=lambda: RopeParameters(rope_type="axial"))


class ThinkerConfig(msgspec.Struct, kw_only=True):
    text_config: TextConfig
    audio_config: AudioEncoderConfig = msgspec.field(default_factory=AudioEncoderConfig)
    vision_config: VisionEncoderConfig = msgspec.field(default_factory=VisionEncoderConfig)
    vision_start_token_id: int = 151652
    audio_token_id: int = 151646
    image_token_id: int = 151655
    video_token_id: int = 151656
    audio_start_token_id: int = 151647
    user_token_id: int = 872
    position_id_per_seconds: int = 25


class TalkerConfig(msgspec.Struct, kw_only=True):
    text_config: TextConfig
    code_predictor_config: TextConfig
    num_code_groups: int = 32
    thinker_hidden_size: int = 2048
    accept_hidden_layer: int = 18
    codec_eos_token_id: int = 4198
    codec_pad_id: int = 4196
    codec_bos_id: int = 4197
    codec_nothink_id: int = 4203
    codec_think_bos_id: int = 4204
    codec_think_eos_id: int = 4205
    speaker_id: dict[str, int] | None = None
    audio_token_id: int = 151646
    image_token_id: int = 151655
    video_token_id: int = 151656


class Code2WavConfig(msgspec.Struct, kw_only=True):
    codebook_size: int = 2048
    hidden_size: int = 1024
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    intermediate_size: int = 3072
    num_hidden_layers: int = 8
    num_quantizers: int = 16
    sliding_window: int = 72
    rms_norm_eps: float = 1e-5
    layer_scale_initial_scale: float = 0.01
    upsample_rates: list[int] = msgspec.field(default_factory=lambda: [8, 5, 4, 3])
    upsampling_ratios: list[int] = msgspec.field(default_factory=lambda: [2, 2])
    decoder_dim: int = 1536
    max_position_embeddings: int = 8000
    rope_parameters: RopeParameters | None = None
    rope_theta: float | None = None
    attention_bias: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def theta(self) -> float:
        if self.rope_parameters is not None:
            return float(self.rope_parameters.rope_theta)
        return float(self.rope_theta or 10000.0)

    @property
    def samples_per_frame(self) -> int:
        out = 1
        for r in [*self.upsample_rates, *self.upsampling_ratios]:
            out *= r
        return out


class Qwen3OmniConfig(msgspec.Struct, JsonConfig, kw_only=True):
    checkpoint = "a Qwen3-Omni checkpoint directory"

    thinker_config: ThinkerConfig
    talker_config: TalkerConfig
    code2wav_config: Code2WavConfig = msgspec.field(default_factory=Code2WavConfig)
    enable_audio_output: bool = True
    im_start_token_id: int = 151644
    im_end_token_id: int = 151645
    tts_pad_token_id: int = 151671
    tts_bos_token_id: int = 151672
    tts_eos_token_id: int = 151673
    system_token_id: int = 8948
    user_token_id: int = 872
    assistant_token_id: int = 77091
    model_type: str | None = None
    mstar_random_weights: bool = False  # set by our tiny generator: every output says the weights are random

    @classmethod
    def from_json(cls, data: bytes | str, *, source: str = "config.json") -> Qwen3OmniConfig:
        raw = decode_json(data, dict, source)  # aliases are resolved on the raw tree, before the types
        try:
            canonical = canonical_fields(raw)
        except AliasConflict as exc:
            raise ConfigError(f"{source}: {exc}") from None
        cfg = convert(canonical, cls, source)
        cfg.check(source)
        return cfg

    def check(self, source: str = "config.json") -> None:
        """Shapes that cannot work, named by field path."""
        bad = field_error(source)
        for name, text in (
            ("thinker_config.text_config", self.thinker_config.text_config),
            ("talker_config.text_config", self.talker_config.text_config),
            ("talker_config.code_predictor_config", self.talker_config.code_predictor_config),
        ):
            require_positive(
                bad,
                text,
                ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads"),
                prefix=name,
            )
            require_divides(
                bad,
                f"{name}.num_key_value_heads",
                text.num_key_value_heads,
                "num_attention_heads",
                text.num_attention_heads,
            )
            if text.num_experts == 0 and text.num_experts_per_tok > 0:
                # would build no experts, and every expert tensor of the checkpoint would be "unexpected"
                raise bad(
                    f"{name}.num_experts",
                    f"0 experts, but num_experts_per_tok is {text.num_experts_per_tok} "
                    "(the expert count is read from num_experts or num_local_experts)",
                )
            if text.num_experts and not 0 < text.num_experts_per_tok <= text.num_experts:
                raise bad(
                    f"{name}.num_experts_per_tok",
                    f"must be in [1, num_experts={text.num_experts}], got {text.num_experts_per_tok}",
                )
            rope = text.rope_parameters
            if (
                rope is not None
                and rope.mrope_section is not None
                and sum(rope.mrope_section) != text.dim_per_head // 2
            ):
                raise bad(
                    f"{name}.rope_parameters.mrope_section",
                    f"{rope.mrope_section} must sum to head_dim / 2 = {text.dim_per_head // 2}",
                )
        talker, thinker = self.talker_config, self.thinker_config
        if talker.text_config.shared_expert_intermediate_size <= 0:
            raise bad(
                "talker_config.text_config.shared_expert_intermediate_size",
                "the Talker's shared expert needs a size > 0",
            )
        if talker.code_predictor_config.hidden_size != talker.text_config.hidden_size:
            raise bad(
                "talker_config.code_predictor_config.hidden_size",
                f"must equal the Talker's hidden_size {talker.text_config.hidden_size}",
            )
        if not 0 <= talker.accept_hidden_layer <= thinker.text_config.num_hidden_layers:
            raise bad(
                "talker_config.accept_hidden_layer",
                f"must be in [0, {thinker.text_config.num_hidden_layers}] (the Thinker's layers)",
            )
        if talker.thinker_hidden_size != thinker.text_config.hidden_size:
            raise bad(
                "talker_config.thinker_hidden_size",
                f"must equal the Thinker's hidden_size {thinker.text_config.hidden_size}",
            )
        if thinker.audio_config.output_dim != thinker.text_config.hidden_size:
            raise bad(
                "thinker_config.audio_config.output_dim",
                f"must equal the Thinker's hidden_size {thinker.text_config.hidden_size}",
            )
        vision = thinker.vision_config
        if vision.out_hidden_size != thinker.text_config.hidden_size:
            raise bad(
                "thinker_config.vision_config.out_hidden_size",
                f"must equal the Thinker's hidden_size {thinker.text_config.hidden_size}",
            )
        if vision.hidden_size % vision.num_heads or (vision.hidden_size // vision.num_heads) % 4:
            raise bad(
                "thinker_config.vision_config.num_heads",
                f"head size {vision.hidden_size} / {vision.num_heads} must be a whole multiple of 4 (2-D RoPE)",
            )
        if int(vision.num_position_embeddings**0.5) ** 2 != vision.num_position_embeddings:
            raise bad(
                "thinker_config.vision_config.num_position_embeddings",
                f"{vision.num_position_embeddings} is not a square grid",
            )
        layers = thinker.text_config.num_hidden_layers
        if (
            any(not 0 <= i < vision.depth for i in vision.deepstack_visual_indexes)
            or len(vision.deepstack_visual_indexes) > layers
        ):
            raise bad(
                "thinker_config.vision_config.deepstack_visual_indexes",
                f"{vision.deepstack_visual_indexes}: each must be a vision layer (depth {vision.depth}), "
                f"and at most {layers} (the Thinker's layers take one each)",
            )
        if vision.hidden_act != "gelu_pytorch_tanh":
            raise bad(
                "thinker_config.vision_config.hidden_act",
                f"{vision.hidden_act!r}: only gelu_pytorch_tanh is implemented",
            )
        if talker.num_code_groups != self.code2wav_config.num_quantizers:
            raise bad(
                "talker_config.num_code_groups",
                f"{talker.num_code_groups} codebooks per frame, but Code2Wav has "
                f"{self.code2wav_config.num_quantizers} quantizers",
            )
