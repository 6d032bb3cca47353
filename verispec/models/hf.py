"""Hugging Face transformers backend: any `AutoModelForCausalLM` with a DynamicCache."""

from __future__ import annotations

import torch

from .. import registry
from .base import CausalLM, eos_token_ids


class HFModel(CausalLM):
    """A transformers causal LM behind the `CausalLM` protocol.

    Args:
        model: a loaded `PreTrainedModel` (eval mode is set here).
        tokenizer: its tokenizer, or None.
        name: label used in statistics and errors.

    The KV cache is a `transformers.DynamicCache`; rollback is
    `DynamicCache.crop(-n_tokens_to_drop)`.
    """

    backend = "transformers"

    def __init__(self, model, tokenizer=None, name: str = "hf-model") -> None:
        super().__init__()
        from transformers import DynamicCache

        self._cache_cls = DynamicCache
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        config = model.config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.context_length = int(getattr(text_config, "max_position_embeddings", 1 << 30))
        self.device = next(model.parameters()).device
        self.eos_token_ids = eos_token_ids(tokenizer, getattr(model, "generation_config", None),
                                           model.config)
        self.cache = DynamicCache(config=config)

    @classmethod
    def open(cls, spec: str, *, fetch_missing: bool = True, device: str | None = None,
             num_hidden_layers: int | None = None) -> "HFModel":
        """`load` the Hugging Face directory `spec` resolves to (`verispec.registry.resolve`).

        Raises:
            UnknownModelError, FileNotFoundError, ChecksumError: from the registry.
        """
        resolved = registry.resolve(spec, fetch_missing=fetch_missing)
        return cls.load(resolved.hf_path, name=resolved.name, device=device,
                        num_hidden_layers=num_hidden_layers)

    @classmethod
    def load(cls, path: str, *, name: str | None = None, dtype: torch.dtype | None = None,
             device: str | None = None, num_hidden_layers: int | None = None) -> "HFModel":
        """Load a model directory or hub id with `from_pretrained`.

        Args:
            path: local directory (config.json + weights) or hub id.
            name: label for statistics; defaults to `path`.
            dtype: defaults to float32 on CPU and bfloat16 on CUDA.
            device: "cpu" or "cuda"; defaults to CUDA when available.
            num_hidden_layers: keep only the first N decoder layers (a cheap
                self-draft, "layer skipping"); None keeps all.

        Raises:
            OSError: from transformers when the path or hub id cannot be loaded.
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if dtype is None:
            dtype = torch.bfloat16 if device == "cuda" else torch.float32
        kwargs = {"dtype": dtype}
        if num_hidden_layers is not None:
            from transformers import AutoConfig

            depth = getattr(AutoConfig.from_pretrained(path), "num_hidden_layers", None)
            if depth is not None and not 1 <= num_hidden_layers <= depth:
                raise ValueError(f"num_hidden_layers (--draft-layers) must be in 1..{depth} for {path}, "
                                 f"got {num_hidden_layers}")
            kwargs["num_hidden_layers"] = num_hidden_layers
        from transformers.utils import logging as hf_logging

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # layer-truncated loads warn about unused weights
        try:
            model = AutoModelForCausalLM.from_pretrained(path, **kwargs).to(device)
        finally:
            hf_logging.set_verbosity(verbosity)
        tokenizer = AutoTokenizer.from_pretrained(path)
        label = name or str(path)
        if num_hidden_layers is not None:
            label += f"[:{num_hidden_layers} layers]"
        return cls(model, tokenizer, name=label)

    @torch.inference_mode()
    def _extend(self, tokens: list[int], keep: int) -> torch.Tensor:
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        out = self.model(input_ids=ids, cache=self.cache, use_cache=True, logits_to_keep=keep)
        return out.logits[0].float().cpu()

    def _truncate(self, length: int) -> None:
        drop = self.cache.get_seq_length() - length
        if length == 0:
            self.cache = self._cache_cls(config=self.model.config)
        elif drop > 0:
            self.cache.crop(-drop)

    @property
    def transformers_model(self):
        """The wrapped transformers `PreTrainedModel` (eval mode), for code that calls
        transformers itself, e.g. `generate` (`verispec.audit.hf_assisted_sampler`).
        It shares this wrapper's weights but not its KV cache, so using it leaves the
        wrapper's state alone."""
        return self.model

    def cache_length(self) -> int:
        """Tokens actually held in the KV cache (for tests of rollback)."""
        return int(self.cache.get_seq_length())

