"""Argument checks for the closed-form theory and its users: each raises ``ValueError`` whose
message names the argument and what it must be (a probability in [0, 1], an integer >= m, a
finite real, ...), so a bad call never yields a NaN or a silent wrong number."""

from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = ["check_alphas", "check_int", "check_nonneg", "check_positive", "check_prob", "check_real",
           "is_scalar_alpha", "to_numpy"]



def check_real(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    x = float(value)
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return x


def check_prob(value: object, name: str) -> float:
    x = check_real(value, name)
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return x


def check_int(value: object, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    n = int(value)
    if n < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return n


def check_nonneg(value: object, name: str) -> float:
    x = check_real(value, name)
    if x < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return x


def check_positive(value: object, name: str) -> float:
    x = check_real(value, name)
    if x <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return x


def check_alphas(alphas: object, name: str = "alphas") -> list[float]:
    if isinstance(alphas, (str, bytes)) or not hasattr(alphas, "__len__"):
        raise ValueError(f"{name} must be a sequence of probabilities in [0, 1], got {alphas!r}")
    arr = np.asarray(alphas)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    return [check_prob(a.item() if hasattr(a, "item") else a, f"{name}[{i}]") for i, a in enumerate(arr)]


def is_scalar_alpha(alpha_or_alphas: object) -> bool:
    if isinstance(alpha_or_alphas, numbers.Real) and not isinstance(alpha_or_alphas, bool):
        return True
    return isinstance(alpha_or_alphas, np.ndarray) and alpha_or_alphas.ndim == 0


def to_numpy(x: object, name: str) -> np.ndarray:
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch.Tensor, without importing torch
        x = x.detach().cpu().double().numpy()
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be an array of probabilities, got {type(x).__name__}") from exc
