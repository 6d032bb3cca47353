"""`verispec analyze`: measure α and the cost curve on this machine, predict the speedup for every k.

Notation as in `verispec.theory`: p = target, q = draft, k drafts, α_i the probability
that draft i is accepted given drafts 1..i-1 were, T_t(n) seconds of a target forward
over n new tokens, T_d seconds per draft token.

Three measurements, each reusing the shipped model protocol and drafters, then predictions:

1. the target's own trajectory and α_i on it (`alpha`: exact Σ min(p_i, q_i), weighted by
   the probability of reaching position i);
2. the cost curve T_t(n), n = 1..K+1, and T_d (`verispec.cost`);
3. with --measure, fixed-k decodes to set beside the predictions (`run`);
4. S(k) = E·T_t(1) / (k·T_d + T_t(k+1)) with per-position α, next to Leviathan et al.'s
   constant-c S(k) = E(α, k) / (k·c + 1), and "curve+" for a draft model
   (`verispec.predict`).

Rooms: `alpha` (α on a trajectory), `run` (the whole analysis, analysis.json); prompts come
from `verispec.prompts`, tables and plots from `verispec.report.analysis`.
"""

from .alpha import (
    AlphaSummary,
    PointRecord,
    TrajectoryAlpha,
    default_stride,
    measure_trajectory_alpha,
    summarize_points,
)
from .run import PROMPT_SELECTION, AnalyzeConfig, load_analysis, run_analysis, write_outputs

__all__ = [
    "PointRecord", "TrajectoryAlpha", "measure_trajectory_alpha", "default_stride", "AlphaSummary",
    "summarize_points", "AnalyzeConfig", "PROMPT_SELECTION", "run_analysis", "write_outputs", "load_analysis",
]
