"""llama.cpp backend (llama-cpp-python): GGUF weights used directly, no float32 conversion.

Install with `pip install verispec[llamacpp]`. A forward over n tokens is one
`llama_decode` call on a batch whose last `keep` positions request logits;
rollback is `llama_memory_seq_rm(seq 0, from position n to the end)`.

Numerics: llama.cpp's matrix kernels may group a batch of k+1 tokens
differently from k+1 single-token calls, so logits can differ in the last bits
between a verification forward and a plain decoding step. verispec's guarantee
is with respect to the target as evaluated in its verification forwards; see
docs/exactness.md.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from .base import CausalLM, eos_token_ids


class LlamaCppModel(CausalLM):
    """A GGUF model run by llama.cpp behind the `CausalLM` protocol.

    Args:
        llama: a `llama_cpp.Llama` created with logits_all=False.
        tokenizer: a Hugging Face tokenizer for the same vocabulary (chat
            template, decoding), or None.
        name: label for statistics.
    """

    backend = "llamacpp"

    def __init__(self, llama, tokenizer=None, name: str = "gguf") -> None:
        super().__init__()
        import llama_cpp

        self._lib = llama_cpp
        self.llama = llama
        self.tokenizer = tokenizer
        self.name = name
        self.vocab_size = int(llama.n_vocab())
        self.context_length = int(llama.n_ctx())
        self.n_batch = int(llama.n_batch)
        eos = {int(llama.token_eos())}
        if tokenizer is not None:
            eos |= eos_token_ids(tokenizer)
            im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
            if isinstance(im_end, int) and im_end != tokenizer.unk_token_id and im_end is not None:
                eos.add(int(im_end))
        self.eos_token_ids = frozenset(eos)
        self._batch = llama._batch

    @classmethod
    def load(cls, gguf_path: str, *, tokenizer_path: str | None = None, name: str | None = None,
             n_ctx: int = 8192, n_threads: int | None = None) -> "LlamaCppModel":
        """Open a GGUF file.

        Args:
            gguf_path: path to the .gguf file.
            tokenizer_path: directory or hub id of a matching HF tokenizer (None: no tokenizer).
            n_ctx: context length in tokens.
            n_threads: CPU threads (default: all cores).

        Raises:
            ImportError: with the install command when llama-cpp-python is missing.
            ValueError: if the file cannot be loaded.
        """
        try:
            from llama_cpp import Llama
        except ImportError as e:  # pragma: no cover - depends on the extra
            raise ImportError("the llamacpp backend needs llama-cpp-python: "
                              "pip install 'verispec[llamacpp]'") from e
        threads = n_threads or os.cpu_count() or 1
        llama = Llama(model_path=str(gguf_path), n_ctx=n_ctx, n_batch=512, n_threads=threads,
                      n_threads_batch=threads, logits_all=False, verbose=False)
        tokenizer = None
        if tokenizer_path is not None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        return cls(llama, tokenizer, name=name or os.path.basename(str(gguf_path)))

    def _extend(self, tokens: list[int], keep: int) -> torch.Tensor:
        out = []
        n_past = len(self.tokens)
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start:start + self.n_batch]
            first_kept = len(tokens) - keep - start   # index in chunk of the first row to keep
            b = self._batch.batch
            b.n_tokens = len(chunk)
            for i, t in enumerate(chunk):
                b.token[i] = t
                b.pos[i] = n_past + start + i
                b.seq_id[i][0] = 0
                b.n_seq_id[i] = 1
                b.logits[i] = i >= first_kept
            self.llama._ctx.decode(self._batch)
            rows = len(chunk) - max(first_kept, 0)
            if rows > 0:
                ptr = self.llama._ctx.get_logits()
                out.append(np.ctypeslib.as_array(ptr, shape=(rows, self.vocab_size)).copy())
        return torch.from_numpy(np.concatenate(out))

    def _truncate(self, length: int) -> None:
        self.llama._ctx.kv_cache_seq_rm(0, length, -1)

