"""Presets: the sizes of well-known models, so a plan needs no download.

Each preset is the architecture from the model's published ``config.json`` (or, for
Chinchilla and its draft, the paper's table), turned into parameter counts by
:func:`verispec.plan.shapes.shape_from_dims`. The derived totals match the published
sizes within 1 % (Chinchilla: 64.7B derived for the nominal 70B; the paper's table
gives layers, width and heads but not every detail). Default dtype: bf16 (pass
``dtype`` to change it).

Names are case-insensitive; an organisation prefix (``meta-llama/``), the suffixes
``-hf``, ``-chat``, ``-instruct``, ``-v1.1``/``-v1.3`` and ``-coder`` are ignored, so
``meta-llama/Llama-2-7b-chat-hf``, ``T5-XXL v1.1`` and ``Qwen/Qwen2.5-Coder-7B-Instruct``
all resolve.
"""

from __future__ import annotations

import difflib
import re

from .shapes import ModelShape, shape_from_dims

__all__ = ["PRESETS", "close_presets", "get_preset", "preset_config", "preset_names"]

_L2 = dict(vocab=32000)
_L3 = dict(vocab=128256)
_Q = dict(vocab=151936, tied=True)     # Qwen2.5 up to 3B tie the LM head to the embeddings
_QB = dict(vocab=152064)                # 7B and larger do not
_T5 = dict(vocab=32128, gated=True, head_dim=64)   # T5 v1.1: gated-GELU, untied head

# name: (dims, source)
_TABLE: dict[str, tuple[dict, str]] = {
    "llama-2-7b": (dict(n_layers=32, d_model=4096, n_heads=32, d_ff=11008, **_L2), "meta-llama/Llama-2-7b-hf config.json"),
    "llama-2-13b": (dict(n_layers=40, d_model=5120, n_heads=40, d_ff=13824, **_L2), "meta-llama/Llama-2-13b-hf config.json"),
    "llama-2-70b": (dict(n_layers=80, d_model=8192, n_heads=64, n_kv_heads=8, d_ff=28672, **_L2),
                    "meta-llama/Llama-2-70b-hf config.json"),
    "llama-3-8b": (dict(n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, d_ff=14336, **_L3),
                   "meta-llama/Meta-Llama-3-8B config.json (Llama 3.1 8B: same sizes)"),
    "llama-3-70b": (dict(n_layers=80, d_model=8192, n_heads=64, n_kv_heads=8, d_ff=28672, **_L3),
                    "meta-llama/Meta-Llama-3-70B config.json (Llama 3.1/3.3 70B: same sizes)"),
    "llama-3.2-1b": (dict(n_layers=16, d_model=2048, n_heads=32, n_kv_heads=8, head_dim=64, d_ff=8192, tied=True, **_L3),
                     "meta-llama/Llama-3.2-1B config.json"),
    "llama-3.2-3b": (dict(n_layers=28, d_model=3072, n_heads=24, n_kv_heads=8, head_dim=128, d_ff=8192, tied=True, **_L3),
                     "meta-llama/Llama-3.2-3B config.json"),
    "qwen2.5-0.5b": (dict(n_layers=24, d_model=896, n_heads=14, n_kv_heads=2, head_dim=64, d_ff=4864, **_Q),
                     "Qwen/Qwen2.5-0.5B config.json"),
    "qwen2.5-1.5b": (dict(n_layers=28, d_model=1536, n_heads=12, n_kv_heads=2, head_dim=128, d_ff=8960, **_Q),
                     "Qwen/Qwen2.5-1.5B config.json"),
    "qwen2.5-3b": (dict(n_layers=36, d_model=2048, n_heads=16, n_kv_heads=2, head_dim=128, d_ff=11008, **_Q),
                   "Qwen/Qwen2.5-3B config.json"),
    "qwen2.5-7b": (dict(n_layers=28, d_model=3584, n_heads=28, n_kv_heads=4, head_dim=128, d_ff=18944, **_QB),
                   "Qwen/Qwen2.5-7B config.json"),
    "qwen2.5-14b": (dict(n_layers=48, d_model=5120, n_heads=40, n_kv_heads=8, head_dim=128, d_ff=13824, **_QB),
                    "Qwen/Qwen2.5-14B config.json"),
    "qwen2.5-32b": (dict(n_layers=64, d_model=5120, n_heads=40, n_kv_heads=8, head_dim=128, d_ff=27648, **_QB),
                    "Qwen/Qwen2.5-32B config.json"),
    "qwen2.5-72b": (dict(n_layers=80, d_model=8192, n_heads=64, n_kv_heads=8, head_dim=128, d_ff=29568, **_QB),
                    "Qwen/Qwen2.5-72B config.json"),
    # Vicuna v1.3 is a LLaMA-1 fine-tune: LLaMA-1 sizes (the 33B is LLaMA "30B").
    "vicuna-7b": (dict(n_layers=32, d_model=4096, n_heads=32, d_ff=11008, **_L2), "lmsys/vicuna-7b-v1.3 config.json"),
    "vicuna-13b": (dict(n_layers=40, d_model=5120, n_heads=40, d_ff=13824, **_L2), "lmsys/vicuna-13b-v1.3 config.json"),
    "vicuna-33b": (dict(n_layers=60, d_model=6656, n_heads=52, d_ff=17920, **_L2), "lmsys/vicuna-33b-v1.3 config.json"),
    "vicuna-68m": (dict(n_layers=2, d_model=768, n_heads=12, d_ff=3072, **_L2),
                   "double7/vicuna-68m config.json (LLaMA-68M, Miao et al. 2023)"),
    "t5-small": (dict(n_layers=8, encoder_layers=8, d_model=512, n_heads=6, d_ff=1024, **_T5), "google/t5-v1_1-small config.json"),
    "t5-base": (dict(n_layers=12, encoder_layers=12, d_model=768, n_heads=12, d_ff=2048, **_T5), "google/t5-v1_1-base config.json"),
    "t5-large": (dict(n_layers=24, encoder_layers=24, d_model=1024, n_heads=16, d_ff=2816, **_T5), "google/t5-v1_1-large config.json"),
    "t5-xl": (dict(n_layers=24, encoder_layers=24, d_model=2048, n_heads=32, d_ff=5120, **_T5), "google/t5-v1_1-xl config.json"),
    "t5-xxl": (dict(n_layers=24, encoder_layers=24, d_model=4096, n_heads=64, d_ff=10240, **_T5), "google/t5-v1_1-xxl config.json"),
    "chinchilla-70b": (dict(n_layers=80, d_model=8192, n_heads=64, head_dim=128, d_ff=32768, gated=False, vocab=32000),
                       "Hoffmann et al. 2022, Table 4 (80 layers, d_model 8192, 64 heads of 128); d_ff = 4·d_model"),
    "chinchilla-draft-4b": (dict(n_layers=8, d_model=6144, n_heads=48, head_dim=128, d_ff=24576, gated=False, vocab=32000),
                            "Chen et al. 2023, Sec. 4 (8 layers, d_model 6144; 48 heads and d_ff = 4·d_model assumed)"),
}

_ALIASES = {
    "chinchilla": "chinchilla-70b", "chinchilla-4b": "chinchilla-draft-4b", "chinchilla-draft": "chinchilla-draft-4b",
    "llama-3.1-8b": "llama-3-8b", "llama-3.1-70b": "llama-3-70b", "llama-3.3-70b": "llama-3-70b",
    "meta-llama-3-8b": "llama-3-8b", "meta-llama-3-70b": "llama-3-70b", "llama-68m": "vicuna-68m",
    "t5-3b": "t5-xl", "t5-11b": "t5-xxl", "qwen2-7b": "qwen2.5-7b",   # Qwen2-7B: Qwen2.5-7B's sizes
}


# suffixes that name a fine-tune or packaging of the same sizes
_SUFFIXES = ("-hf", "-chat", "-instruct", "-it", "-base-model", "-v1.1", "-v1.3", "-v1.5", "-latest",
             "-gguf", "-mlx", "-4bit", "-8bit", "-6bit", "-awq", "-gptq", "-fp16", "-bf16")
# Ollama's default tags (the size `ollama pull NAME` fetches without one): ollama.com/library
_OLLAMA_DEFAULT = {"llama2": "llama-2-7b", "llama3": "llama-3-8b", "llama3.1": "llama-3-8b",
                   "llama3.2": "llama-3.2-3b", "llama3.3": "llama-3-70b", "qwen2.5": "qwen2.5-7b",
                   "qwen2.5-coder": "qwen2.5-7b", "vicuna": "vicuna-7b"}


def _normalise(name: str) -> str:
    """A model name as a preset key.

    Accepts Hugging Face ids (``meta-llama/Meta-Llama-3.1-8B-Instruct``,
    ``Qwen/Qwen2.5-Coder-7B-Instruct``, ``mlx-community/Qwen2.5-72B-Instruct-4bit``),
    Ollama names (``llama3.1:8b``, ``llama3-8b``, ``qwen2.5:0.5b``, ``llama3`` for its
    default tag) and the paper spellings (``T5-XXL v1.1``): organisation, ``meta-``,
    fine-tune and packaging suffixes and quantisation tags (``-q4_k_m``) are dropped, and
    ``llama3`` becomes ``llama-3``.
    """
    key = name.strip().lower().split("/")[-1]
    key = re.sub(r"[\s_:]+", "-", key)
    key = re.sub(r"-(i?q\d[-\w]*|f16|f32|bf16)$", "", key)                  # Ollama/GGUF quant tags
    if key in _OLLAMA_DEFAULT:
        return _OLLAMA_DEFAULT[key]
    key = re.sub(r"^meta-", "", key)
    changed = True
    while changed:
        changed = False
        for suffix in _SUFFIXES:
            if key.endswith(suffix):
                key, changed = key[: -len(suffix)], True
    key = re.sub(r"(\d+(\.\d+)?[bm])-base$", r"\1", key)                    # Qwen2.5-7B-Base, not t5-base
    key = key.replace("-coder", "").replace("t5-v1-1-", "t5-").replace("t5-v1.1-", "t5-")
    key = re.sub(r"^(llama|vicuna)(\d)", r"\1-\2", key)                   # llama3 → llama-3
    key = re.sub(r"^deepseek-r1-distill-(qwen|llama)-", r"\1-", key)        # same sizes as the base
    key = re.sub(r"^qwen-(\d)", r"qwen2.5-\1", key) if key.startswith("qwen-") else key
    return _ALIASES.get(key, key)


def preset_names() -> list[str]:
    """The preset names, in table order."""
    return list(_TABLE)


def close_presets(name: str, n: int = 3) -> list[str]:
    """Preset names spelled like ``name`` (``difflib``), for "did you mean ..."."""
    return difflib.get_close_matches(_normalise(name), list(_TABLE), n=n, cutoff=0.6)


def get_preset(name: str, dtype: str = "bf16") -> ModelShape | None:
    """The preset called ``name`` (HF ids, Ollama names, aliases: see :func:`_normalise`), or None."""
    key = _normalise(name)
    if key not in _TABLE:
        return None
    dims, source = _TABLE[key]
    return shape_from_dims(key, dtype=dtype, source=f"preset: {source}", **dims)


def preset_config(name: str) -> dict:
    """The preset's sizes as a Hugging Face-style config dict (T5 keys for T5 presets).

    :func:`verispec.plan.shapes.shape_from_config` of it gives the preset back (the
    tests check this round trip).

    Raises:
        KeyError: for an unknown preset.
    """
    key = _normalise(name)
    dims = dict(_TABLE[key][0])
    if dims.get("encoder_layers"):
        return {"model_type": "t5", "d_model": dims["d_model"], "d_ff": dims["d_ff"], "num_layers": dims["encoder_layers"],
                "num_decoder_layers": dims["n_layers"], "num_heads": dims["n_heads"], "d_kv": dims["head_dim"],
                "vocab_size": dims["vocab"], "tie_word_embeddings": dims.get("tied", False),
                "feed_forward_proj": "gated-gelu" if dims.get("gated", True) else "relu", "dtype": "bfloat16"}
    heads = dims["n_heads"]
    return {"model_type": "llama" if dims.get("gated", True) else "gpt_neox", "hidden_size": dims["d_model"],
            "num_hidden_layers": dims["n_layers"], "num_attention_heads": heads,
            "num_key_value_heads": dims.get("n_kv_heads", heads), "head_dim": dims.get("head_dim", dims["d_model"] // heads),
            "intermediate_size": dims["d_ff"], "vocab_size": dims["vocab"],
            "tie_word_embeddings": dims.get("tied", False), "dtype": "bfloat16"}


PRESETS: dict[str, ModelShape] = {name: get_preset(name) for name in _TABLE}  # type: ignore[misc]
