"""Gradient-spike log: which prompts were in the batch when ``grad_norm`` blew up.

Loss / grad-norm spikes in GRPO runs usually come from extreme log-probability ratios on a few
tokens, not from advantage outliers. Logging the ratio statistics next to each spike (and the
advantage statistics, to rule them out) plus short hashes of the prompts lets one check whether
the same prompts keep causing spikes without storing the prompt text twice.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlvr.jsonio import append_line, read_jsonl

SPIKES_FILE = "spikes.jsonl"

# Stats whose names start with one of these are kept in a spike record; anything else the
# caller passes (timings, rewards) is dropped to keep the log about the update itself.
SPIKE_STAT_PREFIXES = ("log_ratio", "ratio", "clip_frac", "approx_kl", "policy_loss", "adv_")


def prompt_hash(prompt: str) -> str:
    """First 12 hex digits of the SHA-256 of the prompt's UTF-8 bytes."""
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:12]


class SpikeLog:
    """Append a record to ``run_dir/spikes.jsonl`` whenever ``grad_norm > threshold``.

    A non-finite grad norm (NaN / inf) is also recorded: it is the worst spike of all.
    """

    def __init__(self, run_dir: Path, threshold: float = 50.0) -> None:
        if not isinstance(threshold, int | float) or not math.isfinite(threshold) or threshold <= 0:
            raise ValueError(f"threshold must be a finite number > 0, got {threshold!r}")
        self.path = Path(run_dir) / SPIKES_FILE
        self.threshold = float(threshold)

    def maybe_record(
        self,
        step: int,
        grad_norm: float,
        stats: Mapping[str, Any],
        prompts: Sequence[str],
    ) -> bool:
        """Record the step if ``grad_norm`` is a spike; returns True when a line was written.

        Args:
            step: the training step.
            grad_norm: gradient norm before clipping.
            stats: the step's metrics; keys starting with :data:`SPIKE_STAT_PREFIXES` are kept.
            prompts: the prompt texts of the batch (stored as :func:`prompt_hash` hashes).
        """
        grad_norm = float(grad_norm)
        if math.isfinite(grad_norm) and grad_norm <= self.threshold:
            return False
        kept = {k: v for k, v in stats.items() if k.startswith(SPIKE_STAT_PREFIXES)}
        record = {
            "step": int(step),
            "grad_norm": grad_norm,
            "threshold": self.threshold,
            "stats": kept,
            "num_prompts": len(prompts),
            "prompt_hashes": [prompt_hash(p) for p in prompts],
        }
        append_line(self.path, record)
        return True

    def read(self) -> list[dict[str, Any]]:
        """All spike records so far."""
        return read_jsonl(self.path)
