"""Orpheus TTS as a servable model: its graph, its two submodules, its tokenizer and request builder."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from mstar.conductor import Request
from mstar.engine.device_loop import run_on_device
from mstar.parallel.group import TPGroup
from mstar.sampling_params import SamplingParams
from mstar.weights import no_random_init
from mstar_graphs.orpheus.checkpoints import OrpheusPaths, resolve_paths
from mstar_graphs.orpheus.config import LlamaConfig
from mstar_graphs.orpheus.graph import orpheus_graph
from mstar_graphs.orpheus.llama import LlamaForCausalLM
from mstar_graphs.orpheus.prompt import build_prompt_ids, load_tokenizer
from mstar_graphs.orpheus.snac_stage import OrpheusSnacStage
from mstar_graphs.orpheus.tokens import FRAME_TOKENS, allowed_token_ranges

log = logging.getLogger("mstar_graphs.orpheus")
SAMPLE_RATE = 24_000
# The reference engine's defaults (orpheus-tts): nucleus sampling with a repetition penalty.
DEFAULT_SAMPLING = SamplingParams(temperature=0.6, top_p=0.8, repetition_penalty=1.3, max_tokens=1200)
# the voices the released English finetune (orpheus-3b-0.1-ft) was trained on; its checkpoint does not list them
FINETUNE_VOICES = ("tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe")


class OrpheusLLM(LlamaForCausalLM):
    """The Orpheus Llama with optional audio-token constrained decoding.

    With ``constrain`` on, each step may only emit the SNAC slot's 4096 codes (or
    end-of-speech on a frame boundary, after at least one frame), so every window is
    decodable and the LM head computes ~1/5 of its rows.
    """

    constrain: bool = True

    def allowed_token_ranges(self, num_generated: int) -> list[tuple[int, int]] | None:
        if not self.constrain:
            return None
        ranges = allowed_token_ranges(num_generated)
        return ranges[:1] if num_generated == 0 else ranges  # no empty speech

    def decode_period(self) -> int:
        return FRAME_TOKENS if self.constrain else 1


@dataclass
class OrpheusTTS:
    """Orpheus as a speech model (what the WebRTC gateway serves: entry point group mstar.speech_models)."""

    audio_output = "audio"  # the graph output carrying float PCM chunks
    audio_token_output = "tokens"  # the LLM's tokens: the output audio tokens usage counts
    sample_rate = SAMPLE_RATE
    default_sampling = DEFAULT_SAMPLING

    paths: OrpheusPaths
    llm: OrpheusLLM
    snac: OrpheusSnacStage | None
    voice: str | None = "tara"

    @classmethod
    def load(
        cls,
        weights: str | Path | None = None,
        snac_weights: str | Path | None = None,
        *,
        preset: str = "tiny",
        constrain: bool = True,
        progress: bool = True,
        voice: str | None = "tara",
        tp: TPGroup | None = None,
        requests_only: bool = False,
    ) -> OrpheusTTS:
        """Real weights from ``weights`` (and ``snac_weights``), else the generated tiny checkpoint.
        ``tp``: the LLM is this rank's tensor-parallel shard (rank 0 serves it with ``AREngine(tp=...)``).
        ``requests_only``: read the config and tokenizer, not the weights (Worker processes serve the model:
        the gateway of a placement builds requests only); ``modules()`` then refuses."""
        paths = resolve_paths(weights, snac_weights, preset)
        if paths.random_weights:
            log.warning("Orpheus weights in %s are RANDOM (generated for tests): the audio is noise", paths.llm.parent)
        if requests_only:
            with no_random_init():
                llm = OrpheusLLM(LlamaConfig.from_dir(paths.llm), device="meta")
            model = cls(paths, llm, None, voice)
            model.llm.constrain = constrain
            model.tokenizer = load_tokenizer(paths.llm)
            return model
        # on the engines' thread: one thread runs parallel torch work (see mstar.engine.device_loop)
        llm = run_on_device(OrpheusLLM.from_pretrained_dir, paths.llm, progress=progress, tp=tp)
        run_on_device(llm.fuse_projections)
        llm.constrain = constrain
        snac = run_on_device(OrpheusSnacStage.from_pretrained_dir, paths.snac, progress=progress)
        model = cls(paths, llm, snac, voice)
        model.tokenizer = load_tokenizer(paths.llm)
        return model

    @property
    def random_weights(self) -> bool:
        return self.paths.random_weights

    @property
    def voices(self) -> tuple[str, ...]:
        """The voice names this model speaks in: the finetune's, and the one it was loaded with."""
        return FINETUNE_VOICES + ((self.voice,) if self.voice and self.voice not in FINETUNE_VOICES else ())

    def graph(self):
        return orpheus_graph()

    def worker_spec(self):
        """What Worker processes build to serve this model (``Conductor.distributed``)."""
        from mstar_graphs.orpheus.components import orpheus_spec

        return orpheus_spec(self.paths.llm, self.paths.snac, constrain=self.llm.constrain)

    def modules(self) -> dict[str, torch.nn.Module]:
        if self.snac is None:
            raise RuntimeError("this Orpheus was loaded with requests_only: Worker processes hold its weights")
        return {"llm": self.llm, "snac": self.snac}

    def prompt_ids(self, text: str, voice: str | None = None) -> list[int]:
        return build_prompt_ids(self.tokenizer, text, voice if voice is not None else self.voice)

    def request(
        self,
        text: str,
        *,
        voice: str | None = None,
        sampling: SamplingParams | None = None,
        request_id: str | None = None,
        outputs: frozenset[str] | None = None,
    ) -> Request:
        """A request to speak ``text``; raises ValueError for empty text or text over the context limit.
        ``outputs``: which of "audio" and "tokens" to stream (default both)."""
        return speech_request(
            self.tokenizer,
            self.llm.max_positions,
            text,
            voice=voice if voice is not None else self.voice,
            sampling=sampling,
            request_id=request_id,
            outputs=outputs,
        )


def speech_request(
    tokenizer,
    max_positions: int,
    text: str,
    *,
    voice: str | None = "tara",
    sampling: SamplingParams | None = None,
    request_id: str | None = None,
    outputs: frozenset[str] | None = None,
) -> Request:
    """The request for speaking ``text`` (what OrpheusTTS.request builds, for a process holding only the LLM)."""
    sampling = sampling or DEFAULT_SAMPLING
    ids = build_prompt_ids(tokenizer, text, voice)
    if len(ids) + sampling.max_tokens > max_positions:
        raise ValueError(
            f"text is {len(ids)} prompt tokens; with max_tokens={sampling.max_tokens} that is over "
            f"the model's context limit of {max_positions} tokens"
        )
    kwargs = {} if request_id is None else {"request_id": request_id}
    return Request({"prompt_ids": torch.tensor(ids, dtype=torch.long)}, sampling, outputs=outputs, **kwargs)
