"""Qwen3-Omni as a servable model: its graph, its submodules, and its requests.

A request is a prompt's token ids (with ``<|audio_pad|>`` rows for a clip's audio-encoder
embeddings, whose log-mel ``features`` come with it; or one such slot, for a turn whose samples stream
in as ``pcm`` while it is said; or ``<|image_pad|>`` rows for an image's vision-encoder embeddings) and
how much to say: the Thinker's reply is
greedy by default (the reference's generation config is empty), the Talker samples as the
reference's ``generate`` does (temperature 0.9, top-k 50, repetition penalty 1.05) unless told otherwise.
Outputs: ``text_ids`` (each reply token as it is decided), ``codes`` (each 16-code frame),
``audio`` (24 kHz float PCM chunks from Code2Wav), and ``audio_capped`` ([frames, text tokens]) when
the audio stopped at the cap its text allows (``talker_cap``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import torch

from mstar.conductor import Request
from mstar.conductor.stream_input import StreamInput
from mstar.engine.device_loop import run_on_device
from mstar.sampling_params import SamplingParams
from mstar.weights import no_random_init
from mstar_graphs.qwen3_omni.audio_encoder import tokens_for_frames
from mstar_graphs.qwen3_omni.audio_stream import AudioFramesNode, AudioPromptNode
from mstar_graphs.qwen3_omni.checkpoints import build_component, ensure_tiny_qwen3_omni, load_component
from mstar_graphs.qwen3_omni.config import Qwen3OmniConfig
from mstar_graphs.qwen3_omni.graph import qwen3_omni_graph
from mstar_graphs.qwen3_omni.image_prompt import ImagePositionsNode, MediaPromptNode
from mstar_graphs.qwen3_omni.mrope_positions import thinker_positions
from mstar_graphs.qwen3_omni.talker_cap import cap_note
from mstar_graphs.qwen3_omni.talker_inputs_node import TalkerInputsNode
from mstar_graphs.qwen3_omni.talker_prompt import speaker_code

log = logging.getLogger("mstar_graphs.qwen3_omni")
SAMPLE_RATE = 24_000
THINKER_SAMPLING = SamplingParams(temperature=0.0, max_tokens=1024)
TALKER_SAMPLING = SamplingParams(temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.05, max_tokens=4096)


@dataclass
class Qwen3Omni:
    path: Path
    config: Qwen3OmniConfig
    thinker: torch.nn.Module
    audio_encoder: torch.nn.Module
    vision_encoder: torch.nn.Module
    talker: torch.nn.Module
    code2wav: torch.nn.Module
    speaker: str = "ethan"
    first_chunk: int | None = None  # frames in Code2Wav's first chunk (None: 25, as the others)

    audio_output = "audio"
    sample_rate = SAMPLE_RATE

    @classmethod
    def load(
        cls,
        weights: str | Path | None = None,
        *,
        progress: bool = True,
        speaker: str = "ethan",
        preset: str = "tiny",
        first_chunk: int | None = None,
        requests_only: bool = False,
    ) -> Qwen3Omni:
        """Real weights from ``weights`` (transformers' layout), else the generated ``preset`` checkpoint.
        ``requests_only``: the config, not the weights (the components are built on the meta device): what
        a gateway needs whose Worker processes serve the model; ``modules()`` then refuses."""
        path = Path(weights) if weights is not None else ensure_tiny_qwen3_omni(preset)
        config = Qwen3OmniConfig.from_dir(path)
        if config.mstar_random_weights:
            log.warning("Qwen3-Omni weights in %s are RANDOM (generated for tests): text and audio are noise", path)
        names = ("thinker", "audio_encoder", "vision_encoder", "talker", "code2wav")
        if requests_only:
            with torch.device("meta"), no_random_init():  # no memory: the shapes alone
                parts = {name: build_component(name, config) for name in names}
        else:
            parts = {name: run_on_device(load_component, name, path, progress=progress) for name in names}
        speaker_code(config, speaker)  # an unknown default speaker fails here, not on the first request
        return cls(path, config, speaker=speaker, first_chunk=first_chunk, **parts)

    @property
    def random_weights(self) -> bool:
        return self.config.mstar_random_weights

    def graph(self):
        return qwen3_omni_graph(
            self.config.im_end_token_id, self.config.talker_config.codec_eos_token_id, self.first_chunk
        )

    @property
    def requests_only(self) -> bool:
        return self.thinker.lm_head.weight.is_meta

    def modules(self) -> dict[str, torch.nn.Module]:
        if self.requests_only:
            raise RuntimeError("this Qwen3-Omni was loaded with requests_only: Worker processes hold its weights")
        return {
            "audio_encoder": self.audio_encoder,
            "vision_encoder": self.vision_encoder,
            "thinker": self.thinker,
            "talker_inputs": TalkerInputsNode(self.talker, self.thinker.model.embed_tokens, self.speaker),
            "talker": self.talker,
            "code2wav": self.code2wav,
            **stream_nodes(self.config),
        }

    def request(
        self,
        prompt_ids: list[int],
        *,
        features: torch.Tensor | list[torch.Tensor] | None = None,
        pcm: StreamInput | None = None,
        images: list[tuple[torch.Tensor, tuple[int, int, int]]] | None = None,
        audio: bool = True,
        say_ids: list[int] | None = None,
        thinker_max_tokens: int = 256,
        talker_max_tokens: int = 1024,
        speaker: str | None = None,
        sampling: SamplingParams | None = None,
        talker_sampling: SamplingParams | None = None,
        seed: int | None = None,
        request_id: str | None = None,
        outputs: frozenset[str] | None = None,
        talker_after_reply: bool = False,
        audio_cap: bool = True,
    ) -> Request:
        """``features``: one clip's log-mel frames [128, T] (mstar_graphs.qwen3_omni.audio_features.log_mel), or
        the clips of several turns in prompt order; the prompt then holds exactly ``tokens_for_frames(T)``
        audio pad tokens per clip. ``pcm``: the last turn's 16 kHz samples, streamed in
        (``audio_stream.turn_stream()``); its turn then holds one pad, its slot, after the clips' pads.
        ``images``: (pixel_values, grid_thw) per image in prompt order, as ``image_processor.ImagePreprocessor``
        makes them; the prompt then holds ``<|vision_start|>`` and ``t*h*w/4`` image pad tokens per image.
        The Talker starts on the reply's first token and reads each later one as the Thinker makes it;
        ``talker_after_reply``: it starts once the reply is complete, as the reference does (the same codes;
        its text rows are then projected in one batch, as the reference projects them, to the last bit).
        ``audio_cap``: the Talker's frames are also capped by the reply's text (``talker_cap``; the reference
        has no such cap, only ``talker_max_tokens``); output ``audio_capped`` says when a reply reached it
        (:meth:`audio_cap_note`)."""
        cfg = self.config
        ids = torch.tensor(prompt_ids, dtype=torch.long)
        if ids.dim() != 1 or ids.numel() == 0:
            raise ValueError("prompt_ids must be a non-empty list of token ids")
        vocab = cfg.thinker_config.text_config.vocab_size
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        pads = ids == cfg.thinker_config.audio_token_id
        inputs: dict[str, torch.Tensor] = {"prompt_ids": ids}
        meta: dict = {}
        clips = [] if features is None else [features] if isinstance(features, torch.Tensor) else list(features)
        mels = cfg.thinker_config.audio_config.num_mel_bins
        for clip in clips:
            if clip.dim() != 2 or clip.shape[0] != mels or clip.shape[1] == 0:
                raise ValueError(f"audio features must be [{mels}, frames > 0], got {tuple(clip.shape)}")
        want = sum(tokens_for_frames(clip.shape[1], cfg.thinker_config.audio_config.n_window) for clip in clips)
        if not clips and pcm is None and bool(pads.any()):
            raise ValueError("the prompt has <|audio_pad|> tokens but no audio features came with it")
        if int(pads.sum()) != want + (pcm is not None):
            slot = " and one slot for the streamed turn" if pcm is not None else ""
            raise ValueError(
                f"{sum(c.shape[1] for c in clips)} audio frames make {want} audio tokens{slot}; "
                f"the prompt has {int(pads.sum())} <|audio_pad|>"
            )
        if clips:
            inputs["features"] = torch.cat(clips, dim=1).float()
            inputs["clip_frames"] = torch.tensor([clip.shape[1] for clip in clips], dtype=torch.long)
        if pcm is not None:
            inputs["pcm"] = pcm  # type: ignore[assignment]
            meta["audio_prompt.slot"] = int(pads.nonzero().reshape(-1)[-1])  # the last turn's one pad
        elif clips:
            inputs["embed_mask"] = pads
        if images or bool((ids == cfg.thinker_config.image_token_id).any()):
            inputs |= self._image_inputs(ids, images or [])
            if pcm is not None:  # the widened prompt's mask comes from the graph (audio_prompt)
                del inputs["embed_mask"]
            elif clips:  # audio and images: every pad's row, in prompt order (media_prompt)
                inputs["embed_mask"] = inputs["embed_mask"] | pads
        if say_ids is not None:  # text to speech: the Talker speaks these tokens, as a reply ending with <|im_end|>
            if not say_ids or clips or pcm is not None or images:
                raise ValueError("say_ids needs at least one token, and no audio or images")
            inputs["say_ids"] = torch.tensor(say_ids, dtype=torch.long)
        thinker = sampling or THINKER_SAMPLING
        talker = talker_sampling or TALKER_SAMPLING
        if seed is not None:  # the request's seed seeds every node's sampling (the Talker's, the code predictor's)
            thinker = msgspec.structs.replace(thinker, seed=seed)
        # the Talker's context is its prompt (at most the user turns + 9 rows) and its frames
        talker_room = cfg.talker_config.text_config.max_position_embeddings - len(prompt_ids) - 9
        thinker_room = cfg.thinker_config.text_config.max_position_embeddings - len(prompt_ids)
        if thinker_room < 1 or talker_room < 1:
            raise ValueError(
                f"a prompt of {len(prompt_ids)} tokens leaves no room to answer (context limit "
                f"{cfg.thinker_config.text_config.max_position_embeddings})"
            )
        if pcm is not None:  # the streamed turn's pads come later: the graph takes them off these rooms
            meta |= {"thinker_max_tokens_room": thinker_room, "talker_max_tokens_room": talker_room}
        meta |= {
            "thinker_max_tokens": min(thinker_max_tokens, thinker_room),
            "talker_max_tokens": min(talker_max_tokens, talker_room),
            "audio": audio,
            "talker_after_reply": bool(talker_after_reply),
            "talker_inputs.audio_cap": bool(audio_cap),
            "talker.sampling": talker,
            "talker_inputs.speaker": speaker_code(cfg, speaker or self.speaker),
        }
        return Request(
            inputs=inputs, sampling=thinker, request_id=request_id or uuid.uuid4().hex[:12], meta=meta, outputs=outputs
        )

    @staticmethod
    def audio_cap_note(outputs: Mapping[str, Sequence[torch.Tensor]]) -> str | None:
        """What to tell a listener when a request's audio stopped at the cap its text allows (its output
        ``audio_capped``: [frames, text tokens]); None when the Talker ended it, or the request had no cap."""
        capped = outputs.get("audio_capped")
        if not capped:
            return None
        frames, text = (int(v) for v in capped[-1].reshape(-1))
        return cap_note(text, frames)

    def _image_inputs(self, ids: torch.Tensor, images: list[tuple[torch.Tensor, tuple[int, int, int]]]) -> dict:
        """The vision encoder's inputs, the rows its embeddings take, and the prompt's M-RoPE positions."""
        thinker = self.config.thinker_config
        vision = thinker.vision_config
        if not images:
            raise ValueError("the prompt has <|image_pad|> tokens but no image came with it")
        per_patch = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
        grids = []
        for values, grid in images:
            grid = tuple(int(g) for g in grid)
            if len(grid) != 3 or values.dim() != 2 or values.shape != (grid[0] * grid[1] * grid[2], per_patch):
                raise ValueError(
                    f"an image's pixel_values {tuple(values.shape)} do not fit its grid {grid} "
                    f"({per_patch} values per patch)"
                )
            grids.append(grid)
        thinker_positions(ids, self.config, grids)  # checks each image's pads against its grid, here and now
        return {
            "pixel_values": torch.cat([v for v, _ in images]).float(),
            "image_grid_thw": torch.tensor(grids, dtype=torch.long),
            "embed_mask": ids == thinker.image_token_id,
        }


def stream_nodes(config: Qwen3OmniConfig) -> dict[str, torch.nn.Module]:
    """The weightless nodes: a streamed turn's (mstar_graphs.qwen3_omni.audio_stream), an image prompt's positions."""
    thinker, talker = config.thinker_config, config.talker_config
    room = min(thinker.text_config.max_position_embeddings - 1, talker.text_config.max_position_embeddings - 10)
    return {
        "audio_frames": AudioFramesNode(thinker.audio_config.num_mel_bins),
        "audio_prompt": AudioPromptNode(thinker.audio_token_id, room, thinker.image_token_id),
        "image_positions": ImagePositionsNode(config),
        "media_prompt": MediaPromptNode(config),
    }
