"""Model sizes for the planner: what one decoding forward reads and computes.

A :class:`ModelShape` holds the few numbers the roofline needs (Williams, Waterman,
Patterson 2009, "Roofline: an insightful visual performance model"):

* ``decode_params`` - weights multiplied per new token: every decoder layer plus the
  LM head (the embedding lookup reads only the n rows it needs and is not counted,
  unless the LM head is tied to it). FLOPs per new token ≈ 2 · decode_params
  (one multiply-add per weight; Kaplan et al. 2020, Sec. 2.1).
* ``weight_bytes`` - bytes of those weights, read once per forward whatever n is.
* ``memory_bytes`` - bytes of all weights held on the devices (embeddings, encoder).
* the attention dimensions (layers, heads, KV heads, head size) for the KV cache read
  at context L and the attention FLOPs.

Shapes come from a Hugging Face ``config.json`` (or its directory), a GGUF file (its
metadata and the exact byte size of every tensor, read with the ``gguf`` package), a
registered verispec model (its GGUF when fetched), or a preset of a well-known model
(:mod:`verispec.plan.presets`). Mixture-of-experts models are refused (the planner
would need the active-expert count and routing).
"""

from __future__ import annotations

import difflib
import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from .gguf_header import read_gguf_header

__all__ = [
    "DTYPE_BITS",
    "ModelShape",
    "dtype_bits",
    "head_bits",
    "shape_from_config",
    "shape_from_dims",
    "shape_from_gguf",
]

# Bits per weight as stored (block scales included).
# * Single block types: bytes per block x 8 / weights per block, from ggml's type table
#   (Q8_0: 34 / 32 = 8.5; Q4_0: 18 / 32 = 4.5).
# * llama.cpp's named mixes (Q4_K_M, Q5_K_S, ...): the whole-file average that
#   `llama-quantize --help` prints for Llama-3-8B (e.g. "Q4_K_M : 4.58G"), GiB x 2^33 bits
#   / 8.03e9 parameters; the IQ types as it prints them ("IQ4_XS : 4.25 bpw").
# * bartowski's "_L"/"_XL" files (Q4_K_L = Q4_K_M with Q8_0 embeddings and output head,
#   as his model cards say): the base mix for the layers, 8.5 bits for the head
#   (:data:`HEAD_BITS`).
# * MLX "4bit"/"8bit"...: mlx.core.quantize's default group of 64 with an fp16 scale and
#   bias per group: bits + 32/64.
# * "int4"/"int8": weight-only quantisation with one 16-bit scale per group of 32 (int4)
#   or per output row (int8, about 8 bits).
_LLAMA3_8B = 8.03e9


def _gib(size: float) -> float:
    return round(size * 2**33 / _LLAMA3_8B, 2)


DTYPE_BITS: dict[str, float] = {
    "float32": 32, "fp32": 32, "f32": 32,
    "bfloat16": 16, "bf16": 16, "float16": 16, "fp16": 16, "f16": 16, "half": 16,
    "fp8": 8, "float8": 8, "int8": 8, "int4": 4.5,
    "q8_0": 8.5, "q4_0": _gib(4.34), "q4_1": _gib(4.78), "q5_0": _gib(5.21), "q5_1": _gib(5.65),
    "q2_k": _gib(2.96), "q2_k_s": _gib(2.96), "q3_k_s": _gib(3.41), "q3_k_m": _gib(3.74), "q3_k": _gib(3.74),
    "q3_k_l": _gib(4.03), "q4_k_s": _gib(4.37), "q4_k_m": _gib(4.58), "q4_k": _gib(4.58),
    "q5_k_s": _gib(5.21), "q5_k_m": _gib(5.33), "q5_k": _gib(5.33), "q6_k": _gib(6.14),
    "iq1_s": 1.56, "iq1_m": 1.75, "tq1_0": 1.69, "tq2_0": 2.06, "iq2_xxs": 2.06, "iq2_xs": 2.31, "iq2_s": 2.5,
    "iq2_m": 2.7, "iq3_xxs": 3.06, "iq3_xs": 3.3, "iq3_s": 3.44, "iq3_m": 3.66, "iq4_nl": 4.5, "iq4_xs": 4.25,
    "3bit": 3.5, "4bit": 4.5, "6bit": 6.5, "8bit": 8.5,
}
# bartowski's "_L" / "_XL": the base mix's layers with a Q8_0 output head
_L_VARIANTS = {"q2_k_l": "q2_k", "q3_k_xl": "q3_k_l", "q4_k_l": "q4_k_m", "q5_k_l": "q5_k_m", "q6_k_l": "q6_k"}
DTYPE_BITS.update({name: DTYPE_BITS[base] for name, base in _L_VARIANTS.items()})
HEAD_BITS: dict[str, float] = {name: 8.5 for name in _L_VARIANTS}
# decoder-only families whose MLP is up/down only (2·d·d_ff); the rest are gated (3·d·d_ff)
_UNGATED = ("gpt2", "opt", "gpt_neox", "gptj", "bloom", "falcon", "phi", "starcoder2", "gpt_bigcode")
_DTYPE_ALIASES = {"torch.float32": "float32", "torch.bfloat16": "bfloat16", "torch.float16": "float16",
                  "mostly_q4_k_m": "q4_k_m", "q4": "4bit", "q8": "8bit"}


def _dtype_key(dtype: str) -> str:
    key = str(dtype).strip().lower().replace("-", "_")
    key = key.removeprefix("mostly_")
    return _DTYPE_ALIASES.get(key, key)


def dtype_bits(dtype: str, name: str = "dtype") -> float:
    """Bits per stored weight for a dtype / quantisation name (case-insensitive: Q4_K_M,
    IQ4_XS, Q4_K_L, bf16, MLX 4bit, ...; see :data:`DTYPE_BITS` for the sources).

    Raises:
        ValueError: naming ``name``, with the closest known names, when ``dtype`` is unknown.
    """
    key = _dtype_key(dtype)
    if key not in DTYPE_BITS:
        close = difflib.get_close_matches(key, list(DTYPE_BITS), n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(c.upper() if c[0] in 'qit' else c for c in close)}? " if close else ""
        known = ", ".join(sorted(DTYPE_BITS))
        raise ValueError(f"{name}: unknown dtype {dtype!r}; {hint}known: {known}")
    return float(DTYPE_BITS[key])


def head_bits(dtype: str) -> float | None:
    """Bits of the output head when a dtype stores it apart (bartowski's Q4_K_L...), else None."""
    return HEAD_BITS.get(_dtype_key(dtype))


def _kv_bits(weight_dtype: str) -> float:
    """KV cache bits per element: float32 caches for float32 models, else 16-bit
    (bf16/fp16, also llama.cpp's default f16 cache for quantised weights)."""
    return 32.0 if str(weight_dtype).lower() in ("float32", "fp32", "f32") else 16.0


@dataclass(frozen=True)
class ModelShape:
    """Sizes of one model as the roofline sees them.

    Attributes:
        name: label.
        n_layers: decoder layers run per forward (an encoder is run once per prompt).
        d_model: hidden size (elements of the residual stream; the all-reduce payload).
        n_heads, n_kv_heads, head_dim: attention heads, key/value heads (GQA), head size.
        decode_params: weights multiplied per new token (decoder layers + LM head).
        total_params: all weights (adds untied input embeddings and any encoder).
        weight_bytes: bytes of the ``decode_params`` weights, read once per forward.
        memory_bytes: bytes of all weights (what must fit in device memory).
        dtype: weight dtype / quantisation label.
        kv_bits: bits per cached key/value element.
        cross_attention: encoder-decoder model whose decoder layers also attend to the
            encoder output (its keys/values are cached, read like a KV cache).
        head_params: weights of the output head (vocab x d_model; 0 when unknown), for
            dtypes that store the head apart (:data:`HEAD_BITS`).
        source: where the numbers came from.
    """

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    decode_params: float
    total_params: float
    weight_bytes: float
    memory_bytes: float
    dtype: str
    kv_bits: float = 16.0
    cross_attention: bool = False
    head_params: float = 0.0
    source: str = ""

    def __post_init__(self) -> None:
        for field in ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{self.name}: {field} must be an integer >= 1, got {value!r}")
        for field in ("decode_params", "total_params", "weight_bytes", "memory_bytes", "kv_bits"):
            value = getattr(self, field)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{self.name}: {field} must be a positive number, got {value!r}")

    @property
    def bits_per_weight(self) -> float:
        """Average stored bits per weight read per forward."""
        return 8.0 * self.weight_bytes / self.decode_params

    def kv_bytes_per_token(self) -> float:
        """Bytes of keys + values cached per token (all layers), one sequence."""
        return self.n_layers * 2 * self.n_kv_heads * self.head_dim * self.kv_bits / 8.0

    def flops(self, n: int, context: int, batch: int = 1) -> float:
        """FLOPs of one forward over n new tokens after ``context`` cached tokens.

        2 · decode_params · n · batch for the matrix multiplies, plus attention:
        scores QKᵀ and the weighted sum AV cost 2 · 2 · heads · head_dim FLOPs per
        (query, key) pair; query i of the n attends to context + i keys (causal), and,
        for an encoder-decoder, to ``context`` encoder positions as well.
        """
        pairs = n * context + n * (n + 1) / 2.0
        if self.cross_attention:
            pairs += n * context
        attention = 4.0 * self.n_layers * self.n_heads * self.head_dim * pairs
        return batch * (2.0 * self.decode_params * n + attention)

    def with_dtype(self, dtype: str) -> ModelShape:
        """The same model stored as ``dtype`` (bytes rescaled from the parameter counts).

        Raises:
            ValueError: naming ``dtype`` when it is unknown.
        """
        bits = dtype_bits(dtype)
        extra = (head_bits(dtype) or bits) - bits      # a head stored wider than the layers
        return replace(self, weight_bytes=(self.decode_params * bits + self.head_params * extra) / 8.0,
                       memory_bytes=(self.total_params * bits + self.head_params * extra) / 8.0, dtype=str(dtype),
                       kv_bits=_kv_bits(dtype))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def shape_from_dims(name: str, *, n_layers: int, d_model: int, n_heads: int, d_ff: int, vocab: int,
                    n_kv_heads: int | None = None, head_dim: int | None = None, gated: bool = True,
                    tied: bool = False, encoder_layers: int = 0, dtype: str = "bf16",
                    source: str = "") -> ModelShape:
    """A :class:`ModelShape` from architecture hyper-parameters (parameter counts derived).

    Per decoder layer: attention projections d·h·hd (Q) + 2·d·kv·hd (K, V) + h·hd·d (O),
    the MLP 3·d·d_ff (gated: gate, up, down) or 2·d·d_ff, and for an encoder-decoder
    (``encoder_layers > 0``) a cross-attention block of 4·d·h·hd. Encoder layers have
    self-attention and MLP only. The LM head is vocab·d; untied input embeddings add
    another vocab·d to memory but not to the per-forward reads. Biases and norms are
    left out (< 0.1 % of the weights).

    Raises:
        ValueError: naming ``dtype`` when unknown, or a dimension that is not >= 1.
    """
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    head_dim = d_model // n_heads if head_dim is None else head_dim
    attn = d_model * n_heads * head_dim * 2 + 2 * d_model * n_kv_heads * head_dim
    mlp = (3 if gated else 2) * d_model * d_ff
    cross = 4 * d_model * n_heads * head_dim if encoder_layers else 0
    decoder = n_layers * (attn + mlp + cross)
    head = vocab * d_model
    decode_params = float(decoder + head)
    total = float(decode_params + (0 if tied else head) + encoder_layers * (attn + mlp))
    shape = ModelShape(name=name, n_layers=n_layers, d_model=d_model, n_heads=n_heads,
                       n_kv_heads=n_kv_heads, head_dim=head_dim, decode_params=decode_params,
                       total_params=total, weight_bytes=decode_params * 2.0, memory_bytes=total * 2.0,
                       dtype="bf16", cross_attention=encoder_layers > 0, head_params=float(head), source=source)
    return shape.with_dtype(dtype)


def _config_dtype(cfg: Mapping[str, Any]) -> str | None:
    for key in ("dtype", "torch_dtype"):
        value = cfg.get(key)
        if isinstance(value, str):
            return _DTYPE_ALIASES.get(value, value)
    return None


def shape_from_config(config: str | os.PathLike | Mapping[str, Any], name: str | None = None,
                      dtype: str | None = None) -> ModelShape:
    """A :class:`ModelShape` from a Hugging Face ``config.json`` (a path, its directory, or a dict).

    Reads decoder-only configs (``hidden_size``, ``num_hidden_layers``,
    ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``, ``intermediate_size``,
    ``vocab_size``, ``tie_word_embeddings``; a nested ``text_config`` is used when present)
    and T5 configs (``d_model``, ``d_ff``, ``num_layers``, ``num_decoder_layers``,
    ``num_heads``, ``d_kv``, ``feed_forward_proj``). The dtype is ``dtype`` when given,
    else the config's ``dtype``/``torch_dtype``, else bfloat16.

    Raises:
        FileNotFoundError: naming the path when there is no config.json.
        ValueError: when a needed field is missing, the model is a mixture of experts,
            or the dtype is unknown.
    """
    source = "config dict"
    if not isinstance(config, Mapping):
        path = Path(config).expanduser()
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no config.json at {path}")
        source = str(path)
        name = name or (path.parent.name if path.name == "config.json" else path.stem)
        try:
            config = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from e
    cfg: Mapping[str, Any] = config
    name = name or str(cfg.get("_name_or_path") or cfg.get("model_type") or "model")
    if isinstance(cfg.get("text_config"), Mapping):
        outer_dtype = _config_dtype(cfg)
        cfg = {**cfg["text_config"], **({"dtype": outer_dtype} if outer_dtype and not _config_dtype(cfg["text_config"]) else {})}
    for key in ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"):
        if cfg.get(key):
            raise ValueError(f"{source}: mixture-of-experts models ({key}={cfg[key]}) are not modelled")
    dtype = dtype or _config_dtype(cfg) or "bfloat16"

    def need(*keys: str) -> int:
        for key in keys:
            if cfg.get(key) is not None:
                return int(cfg[key])
        raise ValueError(f"{source}: config has none of {', '.join(keys)}")

    if cfg.get("model_type") == "t5" or ("d_model" in cfg and "num_heads" in cfg):
        layers = need("num_decoder_layers", "num_layers")
        return shape_from_dims(
            name, n_layers=layers, d_model=need("d_model"), n_heads=need("num_heads"),
            head_dim=need("d_kv"), d_ff=need("d_ff"), vocab=need("vocab_size"),
            gated=str(cfg.get("feed_forward_proj", "relu")).startswith("gated"),
            tied=bool(cfg.get("tie_word_embeddings", True)), encoder_layers=need("num_layers"),
            dtype=dtype, source=source)
    heads = need("num_attention_heads", "n_head")
    d_model = need("hidden_size", "n_embd")
    return shape_from_dims(
        name, n_layers=need("num_hidden_layers", "n_layer"), d_model=d_model, n_heads=heads,
        n_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or d_model // heads),
        d_ff=need("intermediate_size", "n_inner"), vocab=need("vocab_size"),
        gated=cfg.get("model_type") not in _UNGATED,
        tied=bool(cfg.get("tie_word_embeddings", False)), dtype=dtype, source=source)


def shape_from_gguf(path: str | os.PathLike, name: str | None = None, dtype: str | None = None) -> ModelShape:
    """A :class:`ModelShape` from a GGUF file: metadata plus the exact size of every tensor.

    ``decode_params``/``weight_bytes`` sum the ``blk.*`` tensors and the output head
    (``output.weight``, or ``token_embd.weight`` when the head is tied to it);
    ``memory_bytes`` sums every tensor. Attention sizes come from
    ``{arch}.block_count``, ``.embedding_length``, ``.attention.head_count(_kv)`` and
    ``.attention.key_length`` (default embedding_length / head_count). The dtype label is
    the file type (e.g. ``MOSTLY_Q4_K_M``); with ``dtype`` the bytes are rescaled instead.
    The header is read by :func:`verispec.plan.gguf_header.read_gguf_header`.

    Raises:
        FileNotFoundError: naming the path.
        ValueError: when the file is not a readable GGUF, lacks a needed key, or is a
            mixture of experts (``{arch}.expert_count`` > 0).
    """
    # the optional GGUF reader, imported only for a .gguf
    from gguf import LlamaFileType

    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    try:
        fields, tensors = read_gguf_header(path)
    except (ValueError, OSError) as e:
        raise ValueError(f"{path} is not a readable GGUF file: {e}") from e
    arch = fields.get("general.architecture")
    if not arch:
        raise ValueError(f"{path}: GGUF has no general.architecture")

    def key(suffix: str, default: Any = None) -> Any:
        value = fields.get(f"{arch}.{suffix}")
        if value is None and default is None:
            raise ValueError(f"{path}: GGUF lacks {arch}.{suffix}")
        value = default if value is None else value
        return max(value) if isinstance(value, list) else value   # per-layer lists: the widest

    if key("expert_count", 0):
        raise ValueError(f"{path}: mixture-of-experts models are not modelled")
    layers = int(key("block_count"))
    d_model = int(key("embedding_length"))
    heads = int(key("attention.head_count"))
    kv = int(key("attention.head_count_kv", heads))
    head_dim = int(key("attention.key_length", d_model // heads))
    names = {t[0] for t in tensors}
    head_name = "output.weight" if "output.weight" in names else "token_embd.weight"
    decode_params = weight_bytes = memory = total = head = 0.0
    for t_name, elements, nbytes in tensors:
        memory += nbytes
        total += elements
        if t_name.startswith("blk.") or t_name == head_name:
            decode_params += elements
            weight_bytes += nbytes
        if t_name == head_name:
            head = float(elements)
    file_type = fields.get("general.file_type")
    try:
        label = LlamaFileType(int(file_type)).name if file_type is not None else "gguf"
    except ValueError:
        label = f"file_type {file_type}"
    name = name or str(fields.get("general.name") or path.stem)
    shape = ModelShape(name=name, n_layers=layers, d_model=d_model, n_heads=heads, n_kv_heads=kv,
                       head_dim=head_dim, decode_params=decode_params, total_params=total,
                       weight_bytes=weight_bytes, memory_bytes=memory, dtype=label, kv_bits=16.0,
                       head_params=head, source=str(path))
    return shape.with_dtype(dtype) if dtype else shape

