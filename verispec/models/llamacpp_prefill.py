"""Prompts prefilled on llama.cpp's plain weight layout, decoded on the repacked one.

Vocabulary:
    layout        how llama.cpp holds a GGUF's weights: *plain* (the file's blocks, mapped
                  as they are) or *repacked* (CPU_REPACK: interleaved at load for AVX2 /
                  Arm kernels). One model has one layout for every forward.
    main          the context verispec decodes on (plain steps, verification, batched rows).
    twin          a second context on a second model of the same file in the plain
                  layout, with the main context's sequences and streams, used only to
                  prefill prompts.
    mirrored      how many leading KV cells of a sequence the twin holds as the main
                  context does (cells are copied, never recomputed).

Why: the two layouts are fast at different shapes. On a 2-core AMD EPYC (AVX-512, Qwen2.5
1.5B Q4_K_M) the repacked weights decode 1.2x faster than the plain ones (their gemv) and
prefill 1.5-1.6x slower (the plain layout's prefill takes the tiled K-quant matmul:
`llama-bench -p 512` 287 against 172 tok/s; a 700-token prompt 2.5 s against 4.2 s in
verispec), so llama.cpp, which picks one layout per model, leaves one of them on the table.
With a twin, the prompt runs on the twin and its KV cells are copied into the main context
(`llama_state_seq_get_data` / `llama_state_seq_set_data`: 20 MB for 700 tokens of Qwen 1.5B,
~0.05 s), where decoding continues on the repacked weights.

Why it is exact: a prefill's numbers only have to be the same wherever the same prompt is
prefilled (plain and speculative decoding, solo and batched, an audit's reference): every
prefill of a model with a twin runs on the twin, in the same 512-token pieces, on the same
kernels, and the copy moves the cells' bytes unchanged into cells 0..n-1 of the sequence's
stream (cell = position, as a prefill in place would leave them). Decode rows never run on
the twin. What changes is which of two exact-but-different evaluations of the quantized
network the prompt gets, as choosing `VERISPEC_LLAMACPP_REPACK` does; the choice is made once
per machine and model file (`choose_layout`) and kept, so a server restarted on the same
machine prefills as before.

Not for: models with sliding-window attention, recurrent or hybrid memory (their sequence
state is not a plain list of cells; `twin_supported`), and builds without repacked weights
(then there is one layout and nothing to gain).
"""

from __future__ import annotations

import ctypes
import json
import os
import time
from pathlib import Path

import numpy as np

from .base import cpu_name, cpu_vector

#: VERISPEC_LLAMACPP_PREFILL: "auto" (default: the twin where it measured faster, `choose_layout`),
#: "plain" (always a twin where supported), "repacked" (never: prefill on the main context)
PREFILL_ENV = "VERISPEC_LLAMACPP_PREFILL"
PREFILL_CHOICES = ("auto", "plain", "repacked")
#: tokens per twin decode, as the main contexts' prefill pieces (LlamaCppModel n_batch, N_BATCH)
PIECE = 512
#: tokens of the timing probe of `choose_layout`, and the share the twin must save to be kept
PROBE_TOKENS = 128
MIN_SAVING = 0.10


def prefill_choice() -> str:
    """The `VERISPEC_LLAMACPP_PREFILL` setting (default "auto").

    Raises:
        ValueError: naming the variable and its choices for any other value.
    """
    value = os.environ.get(PREFILL_ENV, "auto")
    if value not in PREFILL_CHOICES:
        raise ValueError(f"{PREFILL_ENV} must be one of {', '.join(PREFILL_CHOICES)}, got {value!r}")
    return value


def twin_supported(lib, model) -> bool:
    """Whether a llama.cpp model's sequences can move between contexts as plain cells: no
    sliding-window attention (its state omits masked cells), no recurrent or hybrid memory."""
    return (int(lib.llama_model_n_swa(model)) == 0 and not lib.llama_model_is_recurrent(model)
            and not lib.llama_model_is_hybrid(model))


def copy_sequence(lib, src, dst, seq: int) -> int:
    """Replace sequence `seq` of context `dst` by that of context `src` (same model file and
    KV layout: cache types, stream count), cell bytes unchanged, placed from the start of
    its stream.

    Args:
        lib: the `llama_cpp` bindings module.
        src, dst: llama_context pointers.
        seq: the sequence id in both.

    Returns:
        bytes copied.

    Raises:
        RuntimeError: when llama.cpp cannot serialise or restore the sequence.
    """
    size = int(lib.llama_state_seq_get_size(src, seq))
    buf = (ctypes.c_uint8 * max(size, 1))()
    written = int(lib.llama_state_seq_get_data(src, buf, size, seq))
    if size and not written:
        raise RuntimeError(f"llama.cpp could not serialise sequence {seq} ({size} bytes)")
    if int(lib.llama_state_seq_set_data(dst, buf, written, seq)) != written:
        raise RuntimeError(f"llama.cpp could not restore sequence {seq} into the other context "
                           f"({written} bytes): out of KV cells?")
    return written


class PrefillTwin:
    """A plain-layout context that prefills prompts for a main context (module docstring).

    Args (of `open`):
        gguf_path: the main model's GGUF file.
        n_ctx, n_seq_max, kv_unified: the main context's (the twin mirrors its streams, so
            a sequence's state reads back into the same stream layout).
        n_threads: CPU threads, as the main context.
        flash_attn: as the main context (a prefill's kernels must be the same everywhere).

    Attributes:
        mirrored: seq -> leading cells the twin holds as the main context does.
        seconds: wall seconds spent copying cells, accumulated.
    """

    def __init__(self, lib, model, ctx) -> None:
        self._lib, self._model, self._ctx = lib, model, ctx
        self._mem = lib.llama_get_memory(ctx)
        self._batch = lib.llama_batch_init(PIECE, 0, 1)
        self.vocab_size = int(lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(model)))
        self.mirrored: dict[int, int] = {}
        self.seconds = 0.0

    @classmethod
    def open(cls, gguf_path: str, *, n_ctx: int, n_seq_max: int = 1, kv_unified: bool = False,
             n_threads: int, flash_attn: bool) -> PrefillTwin | None:
        """Load the twin, or None where the model does not support one (`twin_supported`).

        Raises:
            ValueError: if llama.cpp cannot load the file or create the context.
        """
        import llama_cpp as lib

        from llama_cpp._utils import suppress_stdout_stderr

        mparams = lib.llama_model_default_params()
        mparams.use_extra_bufts = False          # the plain layout: the file's blocks, mapped
        with suppress_stdout_stderr(disable=False):   # llama.cpp's load log, as Llama(verbose=False)
            model = lib.llama_model_load_from_file(str(gguf_path).encode(), mparams)
        if not model:
            raise ValueError(f"llama.cpp could not load {gguf_path!r} for the prefill twin")
        if not twin_supported(lib, model):
            lib.llama_model_free(model)
            return None
        cparams = lib.llama_context_default_params()
        cparams.n_ctx, cparams.n_seq_max, cparams.kv_unified = n_ctx, n_seq_max, kv_unified
        cparams.n_batch = cparams.n_ubatch = PIECE
        cparams.n_threads = cparams.n_threads_batch = n_threads
        cparams.flash_attn_type = (lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
                                   else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        with suppress_stdout_stderr(disable=False):
            ctx = lib.llama_init_from_model(model, cparams)
        if not ctx:
            lib.llama_model_free(model)
            raise ValueError(f"llama.cpp could not create the prefill twin's context for {gguf_path!r}")
        return cls(lib, model, ctx)

    def forget(self, seq: int, length: int = 0) -> None:
        """The main context's sequence `seq` was rolled back to `length` cells (0: emptied)."""
        if self.mirrored.get(seq, 0) > length:
            self.mirrored[seq] = length

    def prefill(self, main, seq: int, n_past: int, tokens: list[int], keep: int) -> list[np.ndarray]:
        """Prefill `tokens` after the `n_past` cells sequence `seq` holds in context `main`,
        on the twin, and copy the sequence back into `main`.

        Args:
            main: the main llama_context pointer; its sequence `seq` holds exactly n_past cells.
            seq: sequence id (0 for a solo model, the slot for a batch model).
            n_past: cells already in the sequence, >= 0.
            tokens: ids to prefill at positions n_past.., >= 1.
            keep: how many of the last rows to return (0 or 1 for a prefill).

        Returns:
            the kept rows, each [V] float32 (copies), in position order.

        Raises:
            RuntimeError: llama_decode failed on the twin, or a copy failed.
        """
        lib = self._lib
        start = time.perf_counter()
        if self.mirrored.get(seq, 0) < n_past:            # the twin lacks part of the prefix
            copy_sequence(lib, main, self._ctx, seq)
        else:
            lib.llama_memory_seq_rm(self._mem, seq, n_past, -1)
        self.seconds += time.perf_counter() - start
        rows = []
        first_kept = len(tokens) - keep
        for s in range(0, len(tokens), PIECE):
            chunk = tokens[s:s + PIECE]
            b = self._batch
            b.n_tokens = len(chunk)
            for i, t in enumerate(chunk):
                b.token[i], b.pos[i], b.n_seq_id[i] = t, n_past + s + i, 1
                b.seq_id[i][0] = seq
                b.logits[i] = s + i >= first_kept
            code = lib.llama_decode(self._ctx, b)
            if code != 0:
                raise RuntimeError(f"prefill twin: llama_decode failed with code {code} on {len(chunk)} tokens")
            for i in range(len(chunk)):
                if s + i >= first_kept:
                    ptr = lib.llama_get_logits_ith(self._ctx, i)
                    rows.append(np.ctypeslib.as_array(ptr, shape=(self.vocab_size,)).copy())
        start = time.perf_counter()
        copy_sequence(lib, self._ctx, main, seq)
        self.seconds += time.perf_counter() - start
        self.mirrored[seq] = n_past + len(tokens)
        return rows

    def __del__(self) -> None:
        try:
            self.free()
        except Exception:       # noqa: BLE001 - interpreter shutdown: the bindings may be gone
            pass

    def free(self) -> None:
        """Release the twin's context, model and batch (idempotent)."""
        if self._ctx is None:
            return
        self._lib.llama_batch_free(self._batch)
        self._lib.llama_free(self._ctx)
        self._lib.llama_model_free(self._model)
        self._ctx = self._model = None


# -- which layout prefills faster here ---------------------------------------------------------
def layout_key(gguf_path: str, n_threads: int, patch_level: int, flash_attn: bool = True) -> str:
    """The cache key of a layout decision: the file (name and size), threads, CPU (its name
    and SIMD level: VMs sold as one "AMD EPYC" differ in AVX-512, and llama.cpp's prefill
    kernels with it: the plain layout prefilled 1.5x faster than the repacked one with
    AVX-512 and at the same speed on AVX2, benchmarks/llamacpp-native/README.md), build, and
    flash attention (on in the batch-invariant mode, off without it by default; a prefill's
    attention is part of what the probe times)."""
    path = Path(gguf_path)
    return (f"{path.name}:{path.stat().st_size}:t{n_threads}:{cpu_name()}:{cpu_vector()}:"
            f"p{patch_level}" + ("" if flash_attn else ":nofa"))


def _decisions_path() -> Path:
    from ..registry.cache import cache_dir

    return cache_dir() / "llamacpp-prefill-layout.json"


def cached_decision(key: str) -> dict | None:
    """The decision stored for `key`, or None."""
    try:
        return json.loads(_decisions_path().read_text()).get(key)
    except (OSError, ValueError):
        return None


def store_decision(key: str, decision: dict) -> None:
    """Keep `decision` for `key` (best effort: a read-only cache only costs a new probe)."""
    from ..registry.cache import atomic_write_text

    path = _decisions_path()
    try:
        stored = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        stored = {}
    stored[key] = decision
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(stored, indent=1, sort_keys=True) + "\n")
    except OSError:
        pass


def probe_tokens(vocab_size: int) -> list[int]:
    """The ids of the timing probe of `choose_layout` (`PROBE_TOKENS` of them)."""
    return [(7 + 31 * i) % vocab_size for i in range(PROBE_TOKENS)]


def choose_layout(key: str, main_prefill, twin_prefill) -> dict:
    """Whether the twin prefills faster here: the cached decision for `key`, else one
    measured now and stored. `main_prefill()` and `twin_prefill()` each prefill the probe
    from an empty sequence (the twin's copy into the main context included); each runs
    twice, alternated, and the faster of its two times counts. The twin is kept when it
    saves at least `MIN_SAVING` of the main prefill.

    Returns:
        {"twin": bool, "main_seconds": float, "twin_seconds": float, "tokens": int}.
    """
    decision = cached_decision(key)
    if decision is not None:
        return decision
    times = {"main": float("inf"), "twin": float("inf")}
    for _ in range(2):
        for name, run in (("main", main_prefill), ("twin", twin_prefill)):
            start = time.perf_counter()
            run()
            times[name] = min(times[name], time.perf_counter() - start)
    decision = {"twin": times["twin"] < (1.0 - MIN_SAVING) * times["main"], "main_seconds": times["main"],
                "twin_seconds": times["twin"], "tokens": PROBE_TOKENS}
    store_decision(key, decision)
    return decision
