"""Several sequences in one llama.cpp context: one forward scores every active sequence's rows.

A continuous-batching server keeps one llama.cpp context with `n_seq_max` slots. Each slot
is a sequence (llama.cpp's `seq_id`) with its own position-indexed KV cache; `forward_many`
packs the new tokens of every sequence given into `llama_batch`es (one row per token, the
row's `seq_id`, a logits flag on the rows wanted) and runs them with `llama_decode`; rollback
of one sequence is `llama_memory_seq_rm(slot, n, -1)`. `open()` hands out a `SequenceView`,
a `CausalLM` bound to one slot, so the decode loop and the drafters run against a slot
unchanged; `close()` empties the slot for the next request (any slot, any order).

Exactness across sequences (docs/exactness.md, "Several sequences in one forward"):
a sequence's logits must not depend on what else is in the forward. Three things ensure it:

* the batch-invariant kernels of `LlamaCppModel` (no AMX weights; repacked ones only where the
  reference switch scores them row by row, `exact_repack`; with the reference switch every
  decode but a prefill on llama.cpp's reference kernels, else sgemm compiled out, flash
  attention off and at most `INVARIANT_ROWS` rows per `llama_decode`, so the tiled K-quant
  matmul is never reached): every matrix product row is the same `vec_dot` (or repacked
  gemv) calls whatever the other rows are, and every attention row the same one-query pass;
* one KV stream per sequence (`kv_unified=False`): a sequence's attention runs over its own
  cells, laid out at the cells a solo context would use (cell = position), so the
  softmax and the V-weighted sums add the same terms in the same order. In one unified
  buffer a sequence's cells sit at other indices than solo (after other sequences' cells);
  a shift that is not a multiple of the vector width moves terms to other SIMD lanes and
  changes the rounding (up to 0.82 in the logits; docs/exactness.md);
* a prefill (one row kept, more than `INVARIANT_ROWS` tokens) runs alone in its own decodes,
  in the same `n_batch` pieces as a solo `LlamaCppModel`'s prefill, so it may keep the fast
  kernels and still fill the cache with the solo run's numbers.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from .base import CausalLM, eos_token_ids
from .llamacpp import (
    INVARIANT_ROWS,
    batch_invariance_blocker,
    is_prefill,
    prefill_twin,
    reference_switch,
    use_extra_buffers,
)

#: tokens per `llama_decode` for a prefill (as `LlamaCppModel`'s n_batch)
N_BATCH = 512


class SequenceView(CausalLM):
    """One slot of a `LlamaCppBatchModel`, behind the `CausalLM` protocol.

    A plain `forward` on a view is a `forward_many` with this slot alone; the round
    driver (`verispec.batching`) instead gives the owner every view's rows at once.
    Attributes as `CausalLM`; `slot` is the llama.cpp seq_id (0 <= slot < n_seq_max).
    """

    backend = "llamacpp"

    def __init__(self, owner: LlamaCppBatchModel, slot: int) -> None:
        super().__init__()
        self.owner = owner
        self.slot = slot
        self.vocab_size = owner.vocab_size
        self.context_length = owner.context_length
        self.eos_token_ids = owner.eos_token_ids
        self.tokenizer = owner.tokenizer
        self.name = f"{owner.name}[{slot}]"
        self.batch_invariant = owner.batch_invariant
        self.closed = False

    def _extend(self, tokens: list[int], keep: int) -> torch.Tensor:
        return self.owner.score_rows({self.slot: (tokens, keep)})[self.slot]

    def _truncate(self, length: int) -> None:
        self.owner._seq_rm(self.slot, length)

    def close(self) -> None:
        """Free the slot (its cache is emptied); the view must not be used afterwards."""
        self.owner.close(self)


def is_prompt_piece(n_tokens: int, keep: int, offset: int = 0) -> bool:
    """Whether `score_rows` runs a slot's n_tokens rows as a prefill (alone, on the fast
    kernels): a prefill (`is_prefill`), or a later piece of one (offset > 0, keep <= 1)."""
    return is_prefill(n_tokens, keep) or (keep <= 1 and offset > 0)


class LlamaCppBatchModel:
    """A GGUF model in one llama.cpp context with `n_seq_max` independent sequences.

    Args (of `load`; the constructor takes the opened handles):
        gguf_path: the .gguf file.
        n_seq_max: slots (concurrent sequences), >= 1.
        n_ctx_per_seq: context length of every slot, in tokens.
        tokenizer_path: directory of a matching HF tokenizer, or None.
        n_threads: CPU threads (default all cores).
        batch_invariant: as `LlamaCppModel.load` (None: on when possible).
        kv_unified: one KV buffer shared by all slots (llama.cpp's default for one
            sequence); False (default) gives each slot its own stream, which the
            cross-sequence exactness needs (module docstring).
        max_rows: most rows per `llama_decode` for the rows of several sequences
            (default `INVARIANT_ROWS` in the batch-invariant mode without the reference
            switch, else N_BATCH).

    Attributes:
        vocab_size, context_length (per slot), eos_token_ids, tokenizer, name,
        batch_invariant, n_seq_max, max_rows, decodes (llama_decode calls so far).
    """

    #: whether llama.cpp could load the weights into its extra buffer types (`use_extra_buffers`)
    extra_buffers = False
    #: the `PrefillTwin` prompts are prefilled on (`load`), or None
    _twin = None

    def __init__(self, lib, model, ctx, *, n_seq_max: int, n_ctx_per_seq: int, tokenizer=None,
                 name: str = "gguf", batch_invariant: bool = True, max_rows: int | None = None) -> None:
        self._lib, self._model, self._ctx = lib, model, ctx
        self._mem = lib.llama_get_memory(ctx)
        vocab = lib.llama_model_get_vocab(model)
        self.vocab_size = int(lib.llama_vocab_n_tokens(vocab))
        self.context_length = n_ctx_per_seq
        self.n_seq_max = n_seq_max
        self.batch_invariant = batch_invariant
        self._switch = reference_switch() if batch_invariant else None
        self.max_rows = max_rows or (INVARIANT_ROWS if batch_invariant and self._switch is None else N_BATCH)
        self.tokenizer = tokenizer
        self.name = name
        eos = {int(lib.llama_vocab_eos(vocab))}
        if tokenizer is not None:
            eos |= eos_token_ids(tokenizer)
            im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
            if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
                eos.add(int(im_end))
        self.eos_token_ids = frozenset(eos)
        self._batch = lib.llama_batch_init(N_BATCH, 0, 1)
        self._views: dict[int, SequenceView] = {}
        self.decodes = 0
        self.lock = threading.RLock()   # every llama.cpp call on the context holds it

    @classmethod
    def load(cls, gguf_path: str, *, n_seq_max: int = 4, n_ctx_per_seq: int = 4096,
             tokenizer_path: str | None = None, name: str | None = None, n_threads: int | None = None,
             batch_invariant: bool | None = None, kv_unified: bool = False,
             max_rows: int | None = None) -> LlamaCppBatchModel:
        """Open a GGUF file with `n_seq_max` slots (arguments: see the class docstring).

        Raises:
            ValueError: n_seq_max < 1 or n_ctx_per_seq < 1, or a file llama.cpp cannot load.
            RuntimeError: batch_invariant=True where this llama.cpp cannot do it.
        """
        import llama_cpp as lib

        if n_seq_max < 1 or n_ctx_per_seq < 1:
            raise ValueError(f"n_seq_max ({n_seq_max}) and n_ctx_per_seq ({n_ctx_per_seq}) must be >= 1")
        blocker = batch_invariance_blocker() if batch_invariant is not False else None
        if batch_invariant and blocker:
            raise RuntimeError(f"batch_invariant=True is impossible here: {blocker}")
        invariant = batch_invariant is not False and blocker is None
        lib.llama_backend_init()
        mparams = lib.llama_model_default_params()
        extra = use_extra_buffers(invariant)
        if not extra:
            mparams.use_extra_bufts = False
        model = lib.llama_model_load_from_file(str(gguf_path).encode(), mparams)
        if not model:
            raise ValueError(f"llama.cpp could not load {gguf_path!r}")
        threads = n_threads or os.cpu_count() or 1
        cparams = lib.llama_context_default_params()
        cparams.n_ctx = n_ctx_per_seq * n_seq_max
        cparams.n_batch = cparams.n_ubatch = N_BATCH
        cparams.n_seq_max = n_seq_max
        cparams.n_threads = cparams.n_threads_batch = threads
        # as LlamaCppModel.load(flash_attn=None): on exactly where the solo model has it on
        flash = invariant and reference_switch() is not None
        cparams.flash_attn_type = (lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash
                                   else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        cparams.kv_unified = kv_unified
        ctx = lib.llama_init_from_model(model, cparams)
        if not ctx:
            lib.llama_model_free(model)
            raise ValueError(f"llama.cpp could not create a context for {gguf_path!r} "
                             f"({n_seq_max} x {n_ctx_per_seq} tokens)")
        tokenizer = None
        if tokenizer_path is not None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        batch = cls(lib, model, ctx, n_seq_max=n_seq_max, n_ctx_per_seq=n_ctx_per_seq,
                    tokenizer=tokenizer, name=name or os.path.basename(str(gguf_path)),
                    batch_invariant=invariant, max_rows=max_rows)
        batch.extra_buffers = extra      # as LlamaCppModel.extra_buffers
        # prompts on the plain layout where faster, as LlamaCppModel
        batch._twin = prefill_twin(str(gguf_path), n_threads=threads, extra_buffers=extra, flash_attn=flash,
                                   n_ctx=cparams.n_ctx, n_seq_max=n_seq_max, kv_unified=kv_unified,
                                   main=lambda: batch._ctx, main_prefill=batch._probe_prefill)
        return batch

    def _probe_prefill(self) -> None:
        """A layout probe (`llamacpp_prefill.choose_layout`): prefill its tokens in slot 0."""
        from .llamacpp_prefill import probe_tokens

        view = self.open(0)
        try:
            view.forward(probe_tokens(self.vocab_size), keep=1)
        finally:
            view.close()

    # -- slots ------------------------------------------------------------
    @property
    def free_slots(self) -> list[int]:
        """Slots no open view holds, lowest first."""
        return [s for s in range(self.n_seq_max) if s not in self._views]

    def open(self, slot: int | None = None, view_type: type[SequenceView] = SequenceView) -> SequenceView:
        """A view on a free slot (the lowest, or `slot`), its cache empty.

        `view_type` builds it (a `SequenceView` subclass, called as view_type(self, slot)).

        Raises:
            RuntimeError: every slot is taken (close a view first).
            ValueError: `slot` is out of range or taken.
        """
        with self.lock:
            return self._open(slot, view_type)

    def _open(self, slot: int | None, view_type: type[SequenceView]) -> SequenceView:
        free = self.free_slots
        if slot is None:
            if not free:
                raise RuntimeError(f"{self.name}: all {self.n_seq_max} sequence slots are in use; "
                                   f"close a finished sequence or load with a larger n_seq_max")
            slot = free[0]
        elif slot not in free:
            raise ValueError(f"slot {slot} is not free (free: {free}; 0 <= slot < {self.n_seq_max})")
        self._lib.llama_memory_seq_rm(self._mem, slot, -1, -1)
        if self._twin is not None:
            self._twin.forget(slot)
        view = self._views[slot] = view_type(self, slot)
        return view

    def close(self, view: SequenceView) -> None:
        """Empty `view`'s slot and free it (idempotent)."""
        with self.lock:
            if self._views.get(view.slot) is view:
                self._lib.llama_memory_seq_rm(self._mem, view.slot, -1, -1)
                if self._twin is not None:
                    self._twin.forget(view.slot)
                del self._views[view.slot]
        view.closed = True
        view.tokens.clear()

    def _seq_rm(self, slot: int, length: int) -> None:
        with self.lock:
            done = self._lib.llama_memory_seq_rm(self._mem, slot, length, -1)
            if self._twin is not None:
                self._twin.forget(slot, length)
        if not done:
            raise RuntimeError(f"{self.name}: llama.cpp refused to roll slot {slot} back to {length}")

    # -- forwards -----------------------------------------------------------
    def forward_many(self, rows: Mapping[SequenceView, Sequence[int] | tuple[Sequence[int], int]]
                     ) -> dict[SequenceView, torch.Tensor]:
        """Append new tokens to several sequences and score them, packed into shared decodes.

        Args:
            rows: view -> tokens (n >= 1 ids; all n rows returned) or (tokens, keep)
                (only the last `keep` rows returned, as `CausalLM.forward`). One entry per view.

        Returns:
            view -> [min(keep, n), V] float32 logits; row -1 is the next-token logits after
            the view's tokens + its new tokens. Each view's `tokens`, `forwards` and
            `forward_seconds` (the shared wall time) are updated as by `CausalLM.forward`.

        Raises:
            ValueError: a closed or foreign view, an empty token list, or a sequence that
                would exceed `context_length` (nothing is decoded then).
        """
        plan: dict[int, tuple[list[int], int]] = {}
        for view, value in rows.items():
            if view.owner is not self or view.closed:
                raise ValueError(f"{view.name}: not an open sequence of {self.name}")
            tokens, keep = (value if isinstance(value, tuple) else (value, None))
            tokens = [int(t) for t in tokens]
            if not tokens:
                raise ValueError(f"{view.name}: forward_many needs at least one token per sequence")
            if len(view.tokens) + len(tokens) > self.context_length:
                raise ValueError(f"{view.name}: {len(view.tokens) + len(tokens)} tokens exceed the "
                                 f"context length {self.context_length} of a slot")
            keep = len(tokens) if keep is None else max(1, min(keep, len(tokens)))
            plan[view.slot] = (tokens, keep)
        start = time.perf_counter()
        logits = self.score_rows(plan)
        seconds = time.perf_counter() - start
        out = {}
        for view in rows:
            view.tokens.extend(plan[view.slot][0])
            view.forwards += 1
            view.forward_seconds += seconds
            out[view] = logits[view.slot]
        return out

    def score_rows(self, plan: dict[int, tuple]) -> dict[int, torch.Tensor]:
        """Run the rows of `plan`: slot -> (tokens, keep) or (tokens, keep, offset).

        Positions start at len(view.tokens) + offset (offset: rows of this forward already
        run by earlier calls, a prefill in chunks); keep = 0 returns no rows ([0, V]).
        Prefills (keep <= 1 and more than `INVARIANT_ROWS` tokens, or a later piece of one:
        offset > 0) run alone in N_BATCH pieces on the fast kernels, as a solo
        `LlamaCppModel` prefills; every other row runs on the reference kernels (where the
        switch exists) in decodes of at most `max_rows` rows, grouped by block width: the
        sequences that bring the same number of rows share decodes (in slot order), each
        width in decodes of its own, narrowest first. With one KV stream per slot llama.cpp
        cuts a forward into ubatches of equal rows per sequence, so one sequence's 4 rows
        beside another's 1 would run as [A1+B1] then [A3], 12 % dearer than [B1] then [A4]
        (Qwen 1.5B on 2 cores, benchmarks/serve/split_rows.py and its README). The grouping
        changes no logits: in the batch-invariant mode a row's numbers do not depend on
        the other rows of its decode (module docstring).

        The low-level form of `forward_many` for a driver that keeps the views' `tokens`
        itself (`verispec.batching`: the views' own `forward` appends them): it does not
        touch `tokens`, and checks nothing.

        Returns:
            slot -> [rows kept, V] float32 logits, in position order.

        Raises:
            RuntimeError: llama_decode failed (the KV cache may be full); the slots' caches
                may then hold part of the rows, so their sequences must be closed.
        """
        with self.lock:
            return self._decode_locked(plan)

    def _decode_locked(self, plan: dict[int, tuple]) -> dict[int, torch.Tensor]:
        kept: dict[int, list[np.ndarray]] = {slot: [] for slot in plan}
        by_width: dict[int, list[tuple[int, int, int, bool]]] = {}    # width -> (slot, token, pos, logits?)
        for slot, (tokens, keep, *offset) in sorted(plan.items()):
            done = offset[0] if offset else 0
            n_past = len(self._views[slot].tokens) + done
            rows = [(slot, t, n_past + i, i >= len(tokens) - keep) for i, t in enumerate(tokens)]
            if is_prompt_piece(len(tokens), keep, done) and self._twin is not None:
                kept[slot].extend(self._twin.prefill(self._ctx, slot, n_past, tokens, keep))
            elif is_prompt_piece(len(tokens), keep, done):
                for s in range(0, len(rows), N_BATCH):
                    self._run(rows[s:s + N_BATCH], kept, reference=False)
            else:
                by_width.setdefault(len(tokens), []).extend(rows)
        for width in sorted(by_width):
            packed = by_width[width]
            for s in range(0, len(packed), self.max_rows):
                self._run(packed[s:s + self.max_rows], kept, reference=True)
        return {slot: torch.from_numpy(np.stack(kept[slot]) if kept[slot]
                                       else np.zeros((0, self.vocab_size), np.float32)) for slot in plan}

    def _run(self, rows: list[tuple[int, int, int, bool]], kept: dict[int, list[np.ndarray]],
             reference: bool = True) -> None:
        """One llama_decode over `rows` (on the reference kernels if `reference` and the
        switch exists); appends the wanted rows' logits to kept[slot]."""
        if self._switch is not None:
            self._switch(self._ctx, reference)
        b = self._batch
        b.n_tokens = len(rows)
        for i, (slot, token, pos, want) in enumerate(rows):
            b.token[i] = token
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = slot
            b.logits[i] = want
        code = self._lib.llama_decode(self._ctx, b)
        self.decodes += 1
        if code != 0:
            raise RuntimeError(f"{self.name}: llama_decode failed with code {code} on {len(rows)} rows "
                               f"(slots {sorted({r[0] for r in rows})}); the KV cache may be full")
        for i, (slot, _, _, want) in enumerate(rows):
            if want:
                ptr = self._lib.llama_get_logits_ith(self._ctx, i)
                kept[slot].append(np.ctypeslib.as_array(ptr, shape=(self.vocab_size,)).copy())

    def free(self) -> None:
        """Release llama.cpp's context, model and batch (the object is unusable afterwards)."""
        with self.lock:
            if self._ctx is None:
                return
            if self._twin is not None:
                self._twin.free()
                self._twin = None
            self._lib.llama_batch_free(self._batch)
            self._lib.llama_free(self._ctx)
            self._lib.llama_model_free(self._model)
            self._ctx = self._model = None
