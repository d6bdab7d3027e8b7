"""Qwen3-Omni against transformers' Qwen3OmniMoeForConditionalGeneration on one tiny checkpoint
(written in transformers' layout, read by both loaders): Thinker logits, audio features and encoder,
Code2Wav, and generate(return_audio=True) end to end (greedy: the same text, codes and waveform)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mstar_graphs.qwen3_omni.audio_encoder import tokens_for_frames
from mstar_graphs.qwen3_omni.audio_features import log_mel
from mstar_graphs.qwen3_omni.code_predictor import DenseCausalCache
from mstar_graphs.qwen3_omni.direct import chunked_decode, generate
from mstar_graphs.qwen3_omni.reference import reference_generate
from support.qwen3_omni_prompts import TEXT_PROMPT, audio_prompt


def speech_like(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.RandomState(seed)
    t = np.arange(int(16000 * seconds)) / 16000
    return (0.3 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(2 * np.pi * 3 * t)) + 0.02 * rng.randn(len(t))).astype(
        np.float32
    )


def test_thinker_logits_and_accept_layer_match(q3, q3_ref):
    ids = torch.tensor(TEXT_PROMPT)
    with torch.inference_mode():
        ref = q3_ref.thinker(input_ids=ids[None], output_hidden_states=True)
        thinker = q3["thinker"]
        hidden = thinker(ids, torch.arange(len(ids)), DenseCausalCache(1))
        logits = thinker.compute_logits(hidden)
    scale = ref.logits.abs().max()
    assert (logits - ref.logits[0]).abs().max() / scale < 1e-5
    layer = q3["talker"].config.talker_config.accept_hidden_layer
    assert (thinker.captured - ref.hidden_states[layer][0]).abs().max() < 1e-5
    assert torch.equal(logits.argmax(-1), ref.logits[0].argmax(-1))


def test_log_mel_is_whisper_feature_extractors():
    from transformers import WhisperFeatureExtractor

    fe = WhisperFeatureExtractor(feature_size=128, sampling_rate=16000, hop_length=160, n_fft=400, chunk_length=300)
    for n, seed in ((40000, 1), (12345, 2)):
        x = speech_like(n / 16000, seed)
        # as the Qwen3-Omni processor calls it: padded to the longest clip, never truncated
        ref = fe(
            x, sampling_rate=16000, return_tensors="pt", return_attention_mask=True, padding=True, truncation=False
        )
        frames = int(ref["attention_mask"].sum())
        ours = log_mel(torch.from_numpy(x))
        assert ours.shape == (128, n // 160) and frames == n // 160
        assert (ours - ref["input_features"][0, :, :frames]).abs().max() < 1e-6


def test_audio_encoder_matches_and_batches_clips_as_alone(q3, q3_ref):
    """The reference pads a clip's tail chunk to the longest chunk in its batch, which changes the tail's
    outputs; ours pads each clip as it would be alone, so a batch gives each clip its own embeddings."""
    long, short = log_mel(torch.from_numpy(speech_like(2.5, 3))), log_mel(torch.from_numpy(speech_like(0.77, 4)))
    encoder = q3["audio_encoder"]
    with torch.inference_mode():
        alone = [
            q3_ref.thinker.model.audio_tower(
                input_features=f, feature_lens=torch.tensor([f.shape[1]])
            ).last_hidden_state
            for f in (long, short)
        ]
        batched = encoder.encode([long, short])
    for ours, ref, f in zip(batched, alone, (long, short)):
        assert ours.shape == (tokens_for_frames(f.shape[1]), ref.shape[1]) == ref.shape
        assert (ours - ref).abs().max() < 1e-5


def test_code2wav_whole_and_chunked_match(q3, q3_ref):
    codes = torch.randint(0, 2048, (16, 60), generator=torch.Generator().manual_seed(5))
    code2wav = q3["code2wav"]
    with torch.inference_mode():
        whole, ref_whole = code2wav.decode(codes[None]), q3_ref.code2wav(codes[None])
        ours = chunked_decode(code2wav, codes, chunk=25, left_context=25)
        ref = q3_ref.code2wav.chunked_decode(codes[None], chunk_size=25, left_context_size=25).reshape(-1)
    assert whole.shape[-1] == 1920 * 60 - 555 and (whole.abs() < 1).float().mean() > 0.99  # not clipped
    assert (whole - ref_whole).abs().max() < 1e-5
    assert ours.shape == ref.shape == (1920 * 60 - 555 * 3,)  # each chunk loses its last 555 samples
    assert (ours - ref).abs().max() < 1e-5


def test_generate_text_prompt_matches_the_reference(q3, q3_ref):
    ref = reference_generate(q3_ref, TEXT_PROMPT, thinker_max_new_tokens=6, talker_max_new_tokens=12)
    ours = generate(
        q3["thinker"], q3["talker"], q3["code2wav"], TEXT_PROMPT, thinker_max_new_tokens=6, talker_max_new_tokens=12
    )
    assert ours.text_ids == ref.text_ids and len(ours.text_ids) == 6
    assert torch.equal(ours.codes, ref.codes) and ours.codes.shape == (16, 11)  # the last code 0 gets no frame
    assert ours.audio.shape == ref.audio.shape == (1920 * 11 - 555,)
    assert (ours.audio - ref.audio).abs().max() < 1e-5 and ref.audio.abs().max() > 0.05


def test_generate_audio_prompt_matches_the_reference(q3, q3_ref):
    features = log_mel(torch.from_numpy(speech_like(1.5, 6)))
    prompt = audio_prompt(tokens_for_frames(features.shape[1]))
    ref = reference_generate(
        q3_ref, prompt, input_features=features, thinker_max_new_tokens=5, talker_max_new_tokens=10
    )
    with torch.inference_mode():
        rows = q3["audio_encoder"].encode([features])[0]
    ours = generate(
        q3["thinker"],
        q3["talker"],
        q3["code2wav"],
        prompt,
        audio_rows=rows,
        thinker_max_new_tokens=5,
        talker_max_new_tokens=10,
    )
    assert ours.text_ids == ref.text_ids
    assert torch.equal(ours.codes, ref.codes)
    assert (ours.audio - ref.audio).abs().max() < 1e-5


def test_a_one_token_reply_is_a_clear_error(q3):
    with pytest.raises(ValueError, match="at least two reply tokens"):
        generate(q3["thinker"], q3["talker"], q3["code2wav"], TEXT_PROMPT, thinker_max_new_tokens=1)
