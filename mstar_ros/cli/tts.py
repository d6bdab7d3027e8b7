"""``mstar-ros tts``: speak a text with Orpheus, streaming audio chunks as they are decoded."""

from __future__ import annotations

import argparse
import asyncio
import time
import wave
from pathlib import Path

import torch

from mstar.conductor import Conductor
from mstar.progress import progress_bar
from mstar.sampling_params import SamplingParams
from mstar_ros.dtype_option import add_dtype_argument, engine_config


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tts",
        help="text to speech with Orpheus (streams 24 kHz audio to a WAV file)",
        description="Speak TEXT with Orpheus TTS on the Walk Graph runtime and write a 24 kHz mono WAV. "
        "Prints time to first audio, audio seconds and the real-time factor.",
    )
    p.add_argument("--text", required=True, help="what to say")
    p.add_argument("--out", required=True, type=Path, help="output WAV file (16-bit PCM, 24 kHz, mono)")
    p.add_argument(
        "--weights",
        type=Path,
        help="Orpheus checkpoint dir (HF Llama layout: config.json, safetensors, "
        "tokenizer.json); default: generated tiny checkpoint with random weights",
    )
    p.add_argument("--snac-weights", type=Path, help="SNAC 24 kHz checkpoint dir (default: WEIGHTS/snac)")
    p.add_argument("--voice", default="tara", help="voice name put before the text (default: tara; '' for none)")
    p.add_argument("--temperature", type=float, default=0.6, help="0 for greedy (default 0.6)")
    p.add_argument("--top-p", type=float, default=0.8, help="nucleus sampling mass (default 0.8)")
    p.add_argument("--top-k", type=int, default=0, help="top-k filter, 0 = off (default 0)")
    p.add_argument("--repetition-penalty", type=float, default=1.3, help="(default 1.3)")
    p.add_argument(
        "--max-tokens", type=int, default=1200, help="most audio tokens to generate, 7 per 85 ms frame (default 1200)"
    )
    p.add_argument("--seed", type=int, help="fixes sampling and SNAC noise, for reproducible audio")
    add_dtype_argument(p, default=None)
    p.add_argument("--engine-config", type=Path, help="engine settings YAML (see config/engine.yaml)")
    p.add_argument(
        "--placement",
        type=Path,
        help="placement YAML (see config/placement/): run the nodes in Worker processes per rank "
        "instead of in this process",
    )
    p.add_argument(
        "--no-constrain",
        action="store_true",
        help="let the LLM emit any token (default: only the valid SNAC slot's codes at each step)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from mstar_graphs.orpheus.frontend import SAMPLE_RATE, OrpheusTTS

    sampling = SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        repetition_penalty=args.repetition_penalty,
        max_tokens=args.max_tokens,
        seed=args.seed,
    )
    tts = OrpheusTTS.load(args.weights, args.snac_weights, constrain=not args.no_constrain, voice=args.voice or None)
    request = tts.request(args.text, sampling=sampling)
    config = engine_config(args)
    if args.placement:
        from mstar_graphs.orpheus.components import orpheus_spec

        spec = orpheus_spec(args.weights, args.snac_weights, preset="tiny", constrain=not args.no_constrain)
        conductor = Conductor.distributed(spec, args.placement, config=config)
    else:
        conductor = Conductor(tts.graph(), tts.modules(), config=config)
    chunks, summary = asyncio.run(_speak(conductor, request))
    audio = torch.cat(chunks) if chunks else torch.zeros(0)
    _write_wav(args.out, audio, SAMPLE_RATE)
    seconds = audio.numel() / SAMPLE_RATE
    print(f"wrote {args.out}: {seconds:.2f} s of audio in {len(chunks)} chunks, {summary['tokens']} tokens")
    if summary["ttfa"] is not None:
        print(
            f"time to first audio {summary['ttfa'] * 1000:.0f} ms, wall {summary['wall']:.2f} s, "
            f"RTF {summary['wall'] / seconds if seconds else float('nan'):.2f} (wall / audio; < 1 is faster than real time)"
        )
    print(f"dtype {summary['dtype']}")
    if tts.random_weights:
        print(
            "NOTE: the weights are RANDOM (generated tiny checkpoint): the audio is noise. Pass --weights DIR for real speech."
        )
    return 0


async def _speak(conductor: Conductor, request) -> tuple[list[torch.Tensor], dict]:
    chunks: list[torch.Tensor] = []
    tokens = 0
    ttfa = None
    async with conductor:
        start = time.perf_counter()
        with progress_bar(desc="audio", unit="s", unit_scale=False, bar_format="{desc}: {n:.2f} s [{elapsed}]") as bar:
            async for out in conductor.submit(request):
                if out.name == "tokens":
                    tokens += 1
                elif out.name == "audio":
                    if ttfa is None:
                        ttfa = time.perf_counter() - start
                    chunks.append(out.data.float())
                    bar.update(out.data.numel() / 24_000)
        wall = time.perf_counter() - start
        dtype = conductor.dtype_summary()
    return chunks, {"tokens": tokens, "ttfa": ttfa, "wall": wall, "dtype": dtype}


def _write_wav(path: Path, audio: torch.Tensor, rate: int) -> None:
    pcm = (audio.clamp(-1, 1) * 32767).round().to(torch.int16).numpy().tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(pcm)
