"""Resolve a ``--target`` / ``--draft`` value to a :class:`~verispec.plan.shapes.ModelShape`.

Tried in this order: a ModelShape; a registered verispec model (its GGUF when fetched,
else its converted config.json); a path (``.gguf``, ``config.json`` or a Hugging Face
model directory); a preset by name, Hugging Face id or Ollama name
(:func:`verispec.plan.presets.get_preset`). Anything else is an error with "did you
mean ..." and the list of presets. Kept apart from :mod:`.shapes` (which knows sizes)
and :mod:`.presets` (which knows names) so that neither imports the other's caller.
"""

from __future__ import annotations

import os
from pathlib import Path

from .. import registry
from . import presets
from .shapes import ModelShape, dtype_bits, shape_from_config, shape_from_gguf

__all__ = ["load_shape"]


def load_shape(spec: str | os.PathLike | ModelShape, dtype: str | None = None,
               flag: str = "--target", dtype_flag: str = "--dtype") -> ModelShape:
    """Resolve a model spec (see the module doc); ``dtype`` overrides the stored dtype.

    Raises:
        ValueError: naming ``dtype_flag`` for an unknown dtype, or ``flag`` when the spec
            is none of those (with close preset names and the list), a registered model is
            not fetched, or a file cannot be parsed.
    """
    if dtype is not None:
        dtype_bits(dtype, name=dtype_flag)   # an unknown dtype is the dtype flag's fault, not the model's
    if isinstance(spec, ModelShape):
        return spec.with_dtype(dtype) if dtype else spec
    text = str(spec).strip()
    if not text:
        raise ValueError(f"{flag}: empty model name")
    try:
        if text in registry.REGISTRY:
            gguf = registry.gguf_path(text)
            if gguf.exists():
                return shape_from_gguf(gguf, name=text, dtype=dtype)
            hf = registry.hf_dir(text)
            if (hf / "config.json").is_file():
                return shape_from_config(hf, name=text, dtype=dtype)
            raise ValueError(f"registered model {text!r} is not fetched; run `verispec models fetch {text}` "
                             f"or use a preset (e.g. qwen2.5-1.5b)")
        path = Path(text).expanduser()
        looks_like_path = (path.exists() or text.startswith(("/", ".", "~"))
                           or path.suffix.lower() in (".gguf", ".json"))
        if not looks_like_path:
            preset = presets.get_preset(text)
            if preset is not None:
                return preset.with_dtype(dtype) if dtype else preset
        elif path.suffix.lower() == ".gguf":
            return shape_from_gguf(path, dtype=dtype)
        else:
            return shape_from_config(path, dtype=dtype)
    except (ValueError, FileNotFoundError) as e:
        message = str(e)
        raise ValueError(message if message.startswith("--") else f"{flag}: {message}") from e
    close = presets.close_presets(text)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise ValueError(f"{flag}: unknown model {text!r}: not a preset, a registered model, a config.json / "
                     f"model directory or a .gguf file; {hint}Presets (also by Hugging Face id or Ollama "
                     f"name): {', '.join(presets.preset_names())}")
