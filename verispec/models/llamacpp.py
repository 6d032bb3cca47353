"""llama.cpp backend (llama-cpp-python): GGUF weights used directly, no float32 conversion.

Install with `pip install verispec[llamacpp]`. A forward over n tokens is one
`llama_decode` call on a batch whose last `keep` positions request logits;
rollback is `llama_memory_seq_rm(seq 0, from position n to the end)`.

Numerics: by default llama.cpp scores a batch of k+1 tokens with other CPU
kernels than a single token (repacked or AMX weights, the tiled K-quant matmul,
llamafile's sgemm, split-KV flash attention), so a verification forward's logits
differ from plain decoding's by up to ~0.5 and greedy speculative output can leave
plain greedy output at a near-tie. The batch-invariant mode (`batch_invariant`, on
by default when the installed llama.cpp allows it) computes every row of a decode
or verification forward exactly as a single-token forward would: verification
logits are bit-identical to plain decoding's. With the reference switch that
`make setup` builds in (`llama_set_use_ref`, tools/install_llama_cpp.py) it runs
those forwards on the CPU backend's reference kernels and prefills on the fast
ones, at native llama.cpp speed; on a stock llama.cpp built without sgemm it keeps
flash attention off and scores verification forwards in pieces of at most
`INVARIANT_ROWS` rows. See docs/exactness.md ("The batch-invariant mode").
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import threading
import warnings

import numpy as np
import torch

from .. import registry
from .base import CausalLM, eos_token_ids

#: how to get a llama.cpp that can run the batch-invariant mode
REBUILD_HINT = ('python tools/install_llama_cpp.py from verispec\'s repository (`make setup` does this: '
                'the reference switch, native speed), or CMAKE_ARGS="-DGGML_LLAMAFILE=OFF" pip install '
                '--force-reinstall --no-deps --no-cache-dir llama-cpp-python==0.3.36 (no sgemm, slower)')
_TILED_FORCE_ENV = "GGML_CPU_TILED_MM_FORCE"
#: llama.cpp's tiled K-quant matmul takes over from 8 rows (`ggml_tiled_min_batch`); in the
#: batch-invariant mode a forward that returns several rows is scored in pieces of at most this
#: many tokens, so it never reaches that kernel, while a prefill (one row returned) keeps it
INVARIANT_ROWS = 7
_params_lock = threading.Lock()
_warned_unsupported = False
#: "0" keeps llama.cpp's extra buffer types (repacked / AMX weights) off, in the batch-invariant mode
#: and outside it, as llama-server's --no-repack does: on a VM whose CPU reports AMX that the
#: hypervisor does not grant, the repacked AMX kernels die with SIGILL
REPACK_ENV = "VERISPEC_LLAMACPP_REPACK"
#: `llama_verispec_patch()` from which the reference switch also covers repacked weights
#: (tools/install_llama_cpp.py, PATCH_LEVEL)
REPACK_PATCH_LEVEL = 2
#: extra buffer types llama.cpp puts before CPU_REPACK whose kernels the switch does not reach
#: (`llama_print_system_info` names): AMX tiles, Arm's KleidiAI
_UNSWITCHED_BUFFERS = ("AMX_INT8 = 1", "KLEIDIAI = 1")


def is_prefill(n_tokens: int, keep: int) -> bool:
    """Whether a forward of `n_tokens` tokens returning its last `keep` rows is a prefill:
    one row (or none) kept and more than `INVARIANT_ROWS` tokens. The batch-invariant mode
    runs a prefill on the fast kernels, every other forward row by row as single tokens;
    callers use prefills only for tokens plain decoding prefills the same way (the prompt)."""
    return keep <= 1 and n_tokens > INVARIANT_ROWS


@functools.cache
def patch_level() -> int:
    """Which of verispec's llama.cpp edits the installed library has: 0 (a stock build),
    1 (the reference switch, `reference_switch`), 2 or more (`llama_verispec_patch()`:
    the switch also scores repacked weights row by row, as single tokens)."""
    import llama_cpp.llama_cpp as bindings

    fn = getattr(bindings._lib, "llama_verispec_patch", None)
    if fn is None:
        return 1 if reference_switch() is not None else 0
    fn.argtypes, fn.restype = [], ctypes.c_int
    return int(fn())


def exact_repack() -> bool:
    """Whether the batch-invariant mode may keep llama.cpp's repacked weights (CPU_REPACK).

    True when the build's reference switch covers them (`patch_level` >= 2: under the
    switch every row's activations are quantized by the row quantizer and scored by the
    gemv a single token gets, never the 4-row gemm) and no extra buffer type the switch
    does not reach would take the weights first (AMX, KleidiAI). Repacked weights are
    llama.cpp's default on AVX2 and Arm CPUs: a plain step ran 1.3-1.45x faster with them
    than without on a 2-core AMD EPYC (`llama-bench --repack 1` vs `0`,
    benchmarks/llamacpp-native/).
    """
    import llama_cpp

    if patch_level() < REPACK_PATCH_LEVEL:
        return False
    info = llama_cpp.llama_print_system_info().decode(errors="replace")
    return "REPACK = 1" in info and not any(flag in info for flag in _UNSWITCHED_BUFFERS)


def use_extra_buffers(batch_invariant: bool) -> bool:
    """Whether llama.cpp may load weights into its extra buffer types (`use_extra_bufts`):
    in the batch-invariant mode only where they are exact (`exact_repack`), otherwise
    always; never with ``VERISPEC_LLAMACPP_REPACK=0``.

    Raises:
        ValueError: naming VERISPEC_LLAMACPP_REPACK when it is set to neither 0 nor 1.
    """
    value = os.environ.get(REPACK_ENV, "1")
    if value not in ("0", "1"):
        raise ValueError(f"{REPACK_ENV} must be 0 (repacking off, like llama-server --no-repack) or 1, "
                         f"got {value!r}")
    return value == "1" and (not batch_invariant or exact_repack())


@functools.cache
def reference_switch():
    """The installed llama.cpp's `llama_set_use_ref(ctx, bool)`, or None on a stock build.

    `tools/install_llama_cpp.py` (run by `make setup`) adds it: true makes the context's
    CPU backend compute the following decodes with its reference kernels (llamafile's
    sgemm, the tiled K-quant matmul, split-KV and tiled flash attention and op fusion
    off), where every row of a decode is the same `vec_dot` calls as a single-token
    decode; false restores the fast kernels.
    """
    import llama_cpp.llama_cpp as bindings

    fn = getattr(bindings._lib, "llama_set_use_ref", None)
    if fn is not None:
        fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_bool], None
    return fn


def batch_invariance_blocker() -> str | None:
    """Why this process cannot run llama.cpp batch-invariantly, or None if it can.

    None whenever the reference switch is built in (`reference_switch`). On a stock
    llama.cpp two things make it impossible: llamafile's sgemm compiled in (it scores
    the attention products of batches of >= 2 tokens with other kernels than a single
    token, and nothing at run time turns it off), and GGML_CPU_TILED_MM_FORCE=1, which
    sends batches of any size to the tiled K-quant matmul.

    Returns:
        a sentence naming the cause and the fix, or None.
    """
    import llama_cpp

    if reference_switch() is not None:
        return None
    info = llama_cpp.llama_print_system_info().decode(errors="replace")
    if "LLAMAFILE = 1" in info:
        return ("the installed llama-cpp-python was compiled with llamafile's sgemm (LLAMAFILE = 1), "
                "which scores batches with other kernels than single tokens; rebuild it with "
                + REBUILD_HINT)
    if os.environ.get(_TILED_FORCE_ENV, "0") == "1":
        return (f"{_TILED_FORCE_ENV}=1 sends every batch to the tiled K-quant matmul, which scores "
                f"a batch with other kernels than a single token; unset it")
    return None


def prefill_twin(gguf_path: str, *, n_threads: int, extra_buffers: bool, flash_attn: bool, n_ctx: int,
                 main, main_prefill, n_seq_max: int = 1, kv_unified: bool = False):
    """A `PrefillTwin` for a llama.cpp model, or None (`verispec.models.llamacpp_prefill`).

    A twin is only considered where there are two layouts to choose from: the main model
    has extra buffer types (repacked weights; in the batch-invariant mode only where the
    reference switch scores them row by row, `use_extra_buffers`, so prefills and decodes
    already run on different kernels there). Without the mode a twin changes no promise
    either: its prompt's KV cells are the same in a plain run and a speculative one, and
    that mode never claimed rows independent of their batch. `VERISPEC_LLAMACPP_PREFILL`: "repacked"
    never, "plain" always (where the model supports it), "auto" (default) where the
    cached or newly measured `choose_layout` decision for this file, thread count, CPU and
    build says the plain layout prefills at least 10 % faster.

    Args:
        main: returns the main llama_context pointer (for the probe's copy-back).
        main_prefill: runs the probe prefill on the main context (no twin attached yet).
        n_seq_max, kv_unified: the main context's (the twin mirrors its streams).

    Raises:
        ValueError: for a bad VERISPEC_LLAMACPP_PREFILL, or a twin llama.cpp cannot load.
    """
    from . import llamacpp_prefill as lp

    choice = lp.prefill_choice()
    if choice == "repacked" or not extra_buffers:
        return None
    key = lp.layout_key(gguf_path, n_threads, patch_level(), flash_attn)
    known = lp.cached_decision(key) if choice == "auto" else None
    if known is not None and not known["twin"]:
        return None                      # measured here before: the main layout prefills faster
    twin = lp.PrefillTwin.open(gguf_path, n_ctx=n_ctx, n_seq_max=n_seq_max, kv_unified=kv_unified,
                               n_threads=n_threads, flash_attn=flash_attn)
    if twin is None or choice == "plain":
        return twin
    import llama_cpp

    def twin_prefill() -> None:
        twin.prefill(main(), 0, 0, lp.probe_tokens(twin.vocab_size), 1)
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(main()), 0, -1, -1)
        twin.forget(0)

    decision = lp.choose_layout(key, main_prefill, twin_prefill)
    if decision["twin"]:
        return twin
    twin.free()
    return None


@contextlib.contextmanager
def _model_params(**overrides):
    """Make `llama_cpp.Llama` load its model with these llama_model_params fields.

    `Llama.__init__` builds its llama_model_params from
    `llama_cpp.llama_model_default_params()` and exposes no argument for
    `use_extra_bufts`, so the defaults are patched for the duration of the call.
    """
    import llama_cpp.llama_cpp as lib

    with _params_lock:
        default = lib.llama_model_default_params

        def patched():
            params = default()
            for field, value in overrides.items():
                setattr(params, field, value)
            return params

        lib.llama_model_default_params = patched
        try:
            yield
        finally:
            lib.llama_model_default_params = default


class LlamaCppModel(CausalLM):
    """A GGUF model run by llama.cpp behind the `CausalLM` protocol.

    Args:
        llama: a `llama_cpp.Llama` created with logits_all=False.
        tokenizer: a Hugging Face tokenizer for the same vocabulary (chat
            template, decoding), or None.
        name: label for statistics.
        batch_invariant: whether `llama` was loaded in the batch-invariant mode
            (see `load`). Every forward but a prefill is then computed row by row
            as single tokens: with the reference switch (`reference_switch`) on the
            reference kernels, else in pieces of at most `INVARIANT_ROWS` tokens.
            A prefill, a forward with keep=1 over more than `INVARIANT_ROWS`
            tokens, runs whole on the fast kernels and is not batch-invariant:
            callers use it only for tokens that plain decoding prefills the same
            way (the prompt), never for catching up on tokens that plain decoding
            scores one at a time.

    Attribute `stepwise` (default False): a forward that returns several rows computes
    the tokens up to its first returned row in one batch and each later row in a forward
    of its own, as a server prefills a prompt and then decodes. With llama-server's
    kernels (`load(flash_attn=True)`) an audit's reference then computes the very logits
    llama-server decodes with (benchmarks/audit/llama_server_match.py: 628/628
    positions equal); slower than one batch (a decode step per row).
    """

    backend = "llamacpp"
    stepwise = False
    #: whether llama.cpp could load the weights into its extra buffer types (repacked weights where
    #: the CPU and the tensor type have a layout; `use_extra_buffers`), set by `load`
    extra_buffers = False

    def __init__(self, llama, tokenizer=None, name: str = "gguf", batch_invariant: bool = False) -> None:
        super().__init__()
        import llama_cpp

        self._lib = llama_cpp
        self.llama = llama
        self.batch_invariant = batch_invariant
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
        self._switch = reference_switch() if batch_invariant else None
        self._reference: bool | None = None     # what the switch was last set to
        self._twin = None                       # a PrefillTwin (`load`), or None

    def _use_reference(self, on: bool) -> None:
        """Set the context's reference kernels (batch-invariant mode with the switch only)."""
        if self._switch is not None and self._reference is not on:
            self._switch(self.llama._ctx.ctx, on)
            self._reference = on

    @classmethod
    def open(cls, spec: str, *, fetch_missing: bool = True, batch_invariant: bool | None = None,
             n_threads: int | None = None, flash_attn: bool | None = None) -> "LlamaCppModel":
        """`load` the GGUF file `spec` resolves to (`verispec.registry.resolve` with
        weights=False: llama.cpp reads the GGUF itself, so no float32 conversion; the
        tokenizer is the one beside it, or built from the GGUF's metadata).

        Raises:
            UnknownModelError, FileNotFoundError, ChecksumError: from the registry.
            ValueError: when `spec` has no GGUF file.
        """
        resolved = registry.resolve(spec, fetch_missing=fetch_missing, weights=False)
        if resolved.gguf_path is None:
            raise ValueError(f"backend 'llamacpp' needs a GGUF file; {spec!r} has none "
                             "(use a registered name or a .gguf path)")
        tokenizer_path = resolved.hf_path if resolved.kind != "gguf_file" or resolved.hf_path else None
        return cls.load(str(resolved.gguf_path), tokenizer_path=tokenizer_path, name=resolved.name,
                        batch_invariant=batch_invariant, n_threads=n_threads, flash_attn=flash_attn)

    @classmethod
    def load(cls, gguf_path: str, *, tokenizer_path: str | None = None, name: str | None = None,
             n_ctx: int = 8192, n_threads: int | None = None,
             batch_invariant: bool | None = None, flash_attn: bool | None = None) -> "LlamaCppModel":
        """Open a GGUF file.

        Args:
            gguf_path: path to the .gguf file.
            tokenizer_path: directory or hub id of a matching HF tokenizer (None: no tokenizer).
            n_ctx: context length in tokens.
            n_threads: CPU threads (default: all cores).
            batch_invariant: score every row of a forward that returns
                several rows (a verification forward) exactly as a single-token
                forward would: logits bit-identical to plain decoding's. It loads
                the weights without llama.cpp's extra buffer types (no repacked
                or AMX weights) unless the build's switch scores repacked weights
                row by row (`exact_repack`). With the reference switch (`reference_switch`,
                built by `make setup`) decodes and verification forwards run on
                the reference kernels and a prefill (`keep=1`, more than
                `INVARIANT_ROWS` tokens) on the fast ones (sgemm, tiled matmul,
                flash attention), for plain and speculative decoding alike: native
                llama.cpp speed (benchmarks/llamacpp-native/). On a stock llama.cpp
                it needs a build without llamafile's sgemm, keeps flash attention
                off and scores verification forwards in pieces of at most
                `INVARIANT_ROWS` tokens. None (default): on when this llama.cpp
                allows it, else off with a warning; True: required; False:
                llama.cpp's default kernels.
            flash_attn: llama.cpp's flash attention. None (default): on in the
                batch-invariant mode with the reference switch (where it is exact and
                as fast as llama.cpp's default), else off. True: on; without the
                switch it is not batch-invariant, so it needs batch_invariant False
                or None (then off). With batch_invariant False, a reference that
                scores one token per forward with it reproduces llama-server's spec-off
                logits bit for bit (benchmarks/audit/llama_server_match.py).

        Raises:
            ImportError: with the install command when llama-cpp-python is missing.
            ValueError: if the file cannot be loaded, or flash_attn=True with
                batch_invariant=True on a llama.cpp without the reference switch.
            RuntimeError: if batch_invariant=True and this llama.cpp cannot do it
                (the message names the cause and the rebuild command), or if a
                probe forward after loading is not batch-invariant.
        """
        try:
            from llama_cpp import Llama
        except ImportError as e:  # pragma: no cover - depends on the extra
            raise ImportError("the llamacpp backend needs llama-cpp-python: "
                              "pip install 'verispec[llamacpp]'") from e
        global _warned_unsupported
        if flash_attn:
            if batch_invariant and reference_switch() is None:
                raise ValueError("flash_attn=True scores a batch unlike single tokens on this llama.cpp "
                                 "(no reference switch); it cannot be combined with batch_invariant=True "
                                 f"(pass batch_invariant=False, or install {REBUILD_HINT})")
            if batch_invariant is None:
                batch_invariant = False
        if batch_invariant is not False:
            blocker = batch_invariance_blocker()
            if blocker is not None:
                if batch_invariant:
                    raise RuntimeError(f"batch_invariant=True is impossible here: {blocker}")
                if not _warned_unsupported:
                    warnings.warn(f"llama.cpp runs without the batch-invariant mode, so greedy "
                                  f"speculative output may leave plain greedy output at near-ties: "
                                  f"{blocker}", RuntimeWarning, stacklevel=2)
                    _warned_unsupported = True
                batch_invariant = False
            else:
                batch_invariant = True
        if flash_attn is None:
            flash_attn = bool(batch_invariant) and reference_switch() is not None
        threads = n_threads or os.cpu_count() or 1
        extra = use_extra_buffers(batch_invariant)
        params = {} if extra else {"use_extra_bufts": False}
        with _model_params(**params):
            llama = Llama(model_path=str(gguf_path), n_ctx=n_ctx, n_batch=512, n_threads=threads,
                          n_threads_batch=threads, logits_all=False, verbose=False, flash_attn=flash_attn)
        tokenizer = None
        if tokenizer_path is not None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        model = cls(llama, tokenizer, name=name or os.path.basename(str(gguf_path)),
                    batch_invariant=batch_invariant)
        model.extra_buffers = extra
        if batch_invariant:
            model._probe_batch_invariance()
        model._twin = prefill_twin(
            str(gguf_path), n_threads=threads, extra_buffers=extra, flash_attn=bool(flash_attn),
            n_ctx=n_ctx, main=lambda: model.llama._ctx.ctx, main_prefill=model._probe_prefill)
        return model

    def _probe_prefill(self) -> None:
        """A `choose_layout` probe: prefill its tokens on this context from an empty cache."""
        from .llamacpp_prefill import probe_tokens

        self.reset()
        self.forward(probe_tokens(self.vocab_size), keep=1)
        self.reset()

    def _probe_batch_invariance(self, rows: int = INVARIANT_ROWS + 1) -> None:
        """Check that a `rows`-token forward equals `rows` single-token forwards bit for bit.

        Eight rows (one forward on the reference kernels, or 7 + 1 without the
        switch) reach every batch-size-dependent path of llama.cpp's CPU backend
        at short context (sgemm from 2 rows, repack gemm from 4, the tiled matmul
        from 8) and the piecewise scoring itself, so a kernel left on by this build
        or environment is caught here, before any output.
        Costs rows + 3 forwards; leaves the cache empty.

        Raises:
            RuntimeError: naming the largest logit difference and the fix.
        """
        ids = [(7 + 31 * i) % self.vocab_size for i in range(rows + 1)]
        self.reset()
        self.forward(ids[:1])
        single = torch.cat([self.forward([t]) for t in ids[1:]])
        self.reset()
        self.forward(ids[:1])
        batch = self.forward(ids[1:])
        self.reset()
        self.forward_seconds, self.forwards = 0.0, 0
        if not torch.equal(single, batch):
            gap = float((single - batch).abs().max())
            raise RuntimeError(
                f"{self.name}: llama.cpp is not batch-invariant here (a {rows}-token forward "
                f"differs from {rows} single-token forwards by up to {gap:.3g} in the logits); "
                f"load with batch_invariant=False (--no-batch-invariant), and report the "
                f"llama.cpp build: {self._lib.llama_print_system_info().decode(errors='replace')}")

    @contextlib.contextmanager
    def decoding(self):
        """Keep torch to one intra-op thread while llama.cpp decodes (restored after).

        torch's and llama.cpp's OpenMP pools are separate; after every parallel torch op
        (a softmax or argmax over V ~ 150k logits) torch's idle workers spin-wait and
        take cores from llama.cpp's next forward. The per-token torch work is a few
        vector ops over V, faster on one thread than the spin it causes
        (benchmarks/llamacpp-native/). This is what the test suite's
        OMP_WAIT_POLICY=passive worked around, without slowing llama.cpp's own waits.
        """
        before = torch.get_num_threads()
        if before != 1:
            torch.set_num_threads(1)
        try:
            yield
        finally:
            if before != 1:
                torch.set_num_threads(before)

    def _extend(self, tokens: list[int], keep: int) -> torch.Tensor:
        out = []
        n_past = len(self.tokens)
        step = self.n_batch
        if self._twin is not None and is_prefill(len(tokens), keep) and not self.stepwise:
            rows = self._twin.prefill(self.llama._ctx.ctx, 0, n_past, tokens, keep)
            return torch.from_numpy(np.stack(rows) if rows else np.zeros((0, self.vocab_size), np.float32))
        self._use_reference(not is_prefill(len(tokens), keep))
        if self.batch_invariant and self._switch is None and keep > 1:   # stay below the tiled matmul
            step = min(step, INVARIANT_ROWS)
        starts = list(range(0, len(tokens), step))
        if self.stepwise and keep > 1:          # prefill through the first kept row, then 1 row each
            first = len(tokens) - keep + 1
            starts = list(range(0, first, step)) + list(range(first, len(tokens)))
        for start, end in zip(starts, starts[1:] + [len(tokens)]):
            chunk = tokens[start:end]
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
        return torch.from_numpy(out[0] if len(out) == 1 else np.concatenate(out))

    def _truncate(self, length: int) -> None:
        self.llama._ctx.kv_cache_seq_rm(0, length, -1)
        if self._twin is not None:
            self._twin.forget(0, length)

