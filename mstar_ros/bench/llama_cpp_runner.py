"""llama.cpp (through llama-cpp-python's low-level API) decoding C greedy streams of token ids.

The high-level ``Llama`` class creates its context with one sequence, so C > 1 streams need the
C API as llama.cpp's own batched example uses it: a context with ``n_seq_max = C``, one
``llama_batch`` per step holding each stream's token under its own sequence id, logits for the
rows that sample. C = 1 runs the same code, so both levels are measured alike. Greedy sampling is
an argmax over the full vocabulary's logits (numpy), as our engine's greedy sampler does.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

_QUIET: list = []  # the installed log callback: ctypes must keep it alive


def silence_llama_cpp() -> None:
    """llama.cpp logs loads and quantization warnings to stderr: they would bury the progress bars."""
    if _QUIET:
        return
    import ctypes

    import llama_cpp

    @llama_cpp.llama_log_callback
    def quiet(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        pass

    _QUIET.append(quiet)
    llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))


class LlamaCppDecoder:
    """A GGUF model and a context for ``streams`` sequences of up to ``per_stream_tokens`` tokens each."""

    def __init__(
        self, path: str | Path, *, threads: int, streams: int, per_stream_tokens: int, extra_buffers: bool = True
    ) -> None:
        """``extra_buffers``: llama.cpp's extra weight buffer types (AMX tiles, repacked layouts), on by
        default as in llama.cpp. With them llama_decode segfaulted (llama-cpp-python 0.3.36 built natively
        on an Intel Xeon with AMX) on the tiny preset's files and on the decode preset's Q8_0 and Q4_K_M,
        so the tests, ``bench decode --quick`` and ``bench decode`` on an AMX CPU turn them off."""
        import llama_cpp

        silence_llama_cpp()
        self._ll = llama_cpp
        llama_cpp.llama_backend_init()
        model_params = llama_cpp.llama_model_default_params()
        model_params.n_gpu_layers = 0
        model_params.use_extra_bufts = extra_buffers
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), model_params)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.streams = streams
        self.batch_rows = max(streams, per_stream_tokens)
        params = llama_cpp.llama_context_default_params()
        # each sequence gets n_ctx / n_seq_max cells, which llama.cpp rounds up to a multiple of 256
        params.n_ctx = streams * -(-per_stream_tokens // 256) * 256
        params.n_batch = params.n_ubatch = self.batch_rows
        params.n_seq_max = streams
        params.n_threads = params.n_threads_batch = threads
        self.flash_attn_type = int(params.flash_attn_type)  # llama.cpp's default, recorded
        self.ctx = llama_cpp.llama_init_from_model(self.model, params)
        if not self.ctx:
            llama_cpp.llama_model_free(self.model)
            raise RuntimeError(f"llama.cpp could not make a context for {path}")
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model))
        self.batch = llama_cpp.llama_batch_init(self.batch_rows, 0, streams)

    def close(self) -> None:
        ll = self._ll
        if self.ctx:
            ll.llama_batch_free(self.batch)
            ll.llama_free(self.ctx)
            ll.llama_model_free(self.model)
            self.ctx = self.model = None

    def __enter__(self) -> LlamaCppDecoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reset(self) -> None:
        """Forget every sequence's KV."""
        self._ll.llama_memory_clear(self._ll.llama_get_memory(self.ctx), True)

    def _decode(self, rows: list[tuple[int, int, int, bool]]) -> None:
        """One llama_decode of ``rows`` = (token, position, sequence, wants logits)."""
        if len(rows) > self.batch_rows:
            raise ValueError(f"{len(rows)} rows exceed the batch of {self.batch_rows}")
        b = self.batch
        b.n_tokens = len(rows)
        for i, (token, pos, seq, logits) in enumerate(rows):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, logits
            b.seq_id[i][0] = seq
        status = self._ll.llama_decode(self.ctx, b)
        if status != 0:
            raise RuntimeError(f"llama_decode returned {status}")

    def _logits(self, row: int) -> np.ndarray:
        ptr = self._ll.llama_get_logits_ith(self.ctx, row)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def prompt_logits(self, token_ids: list[int]) -> np.ndarray:
        """Logits [T, V] (float32, copied) at every position of one sequence, from an empty KV."""
        self.reset()
        self._decode([(t, p, 0, True) for p, t in enumerate(token_ids)])
        return np.stack([self._logits(i).copy() for i in range(len(token_ids))])

    def greedy(self, prompts: list[list[int]], new_tokens: int) -> tuple[list[list[int]], float]:
        """Each prompt's ``new_tokens`` greedy tokens, and the seconds of the decode steps after the
        first token (the prefill that makes it is not timed: ``(new_tokens - 1) * len(prompts)`` tokens)."""
        if len(prompts) > self.streams:
            raise ValueError(f"{len(prompts)} prompts, but the context holds {self.streams} streams")
        self.reset()
        out = []
        for seq, prompt in enumerate(prompts):  # one prefill per stream (not timed)
            self._decode([(t, p, seq, p == len(prompt) - 1) for p, t in enumerate(prompt)])
            out.append([int(np.argmax(self._logits(len(prompt) - 1)))])
        positions = [len(p) for p in prompts]
        start = time.perf_counter()
        for _ in range(new_tokens - 1):
            self._decode([(toks[-1], positions[s], s, True) for s, toks in enumerate(out)])
            for s, toks in enumerate(out):
                toks.append(int(np.argmax(self._logits(s))))
                positions[s] += 1
        return out, time.perf_counter() - start
