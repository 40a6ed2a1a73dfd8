"""Learning-rate schedules and the pre-flight check that they reach a useful LR in time.

A warmup longer than the run itself loses the run silently: the LR never got near its target and
the model barely moved. :func:`preflight_check` evaluates the very function the trainer's
scheduler uses (:func:`lr_factor`, wrapped by :func:`build_scheduler`) and fails before any
compute is spent when the LR is still low by ``check_step``.

The step unit is one ``scheduler.step()`` call. ``warmup_steps`` and ``total_steps`` must be
counted in the same unit the trainer steps the scheduler in (rlvr's trainer: once per training
step, after all of that step's minibatch updates).

The schedule, for step ``s`` (0-based) and ``W = warmup_steps``, ``T = total_steps``,
``m = min_lr_ratio``:

- warm-up, ``s < W``: ``(s + 1) / W``. Step 0 already trains at ``1/W`` of the peak (a step at
  LR 0 would be wasted) and step ``W - 1`` is the first at the full peak.
- after warm-up, with ``p = clamp((s - W) / max(1, T - W), 0, 1)``:
  ``constant``: 1; ``linear``: ``1 - (1 - m) * p``; ``cosine``: ``m + (1 - m) * (1 + cos(pi p)) / 2``.
  Both decays start at 1 at ``s = W`` and reach ``m`` at ``s = T`` (and stay there after).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import torch

ScheduleKind = Literal["constant", "cosine", "linear"]
SCHEDULE_KINDS: tuple[str, ...] = ("constant", "cosine", "linear")


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _validate(kind: str, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> None:
    if kind not in SCHEDULE_KINDS:
        raise ValueError(f"unknown schedule kind {kind!r}; known: {', '.join(SCHEDULE_KINDS)}")
    _check_int("warmup_steps", warmup_steps, 0)
    _check_int("total_steps", total_steps, 1)
    if not isinstance(min_lr_ratio, int | float) or not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio must be a number in [0, 1], got {min_lr_ratio!r}")


def lr_factor(
    step: int,
    *,
    kind: ScheduleKind,
    warmup_steps: int,
    total_steps: int,
    min_lr_ratio: float = 0.1,
) -> float:
    """Multiplier of the peak LR at ``step`` (see the module docstring for the exact formula).

    A warmup longer than the run is allowed here (it is what :func:`preflight_check` exists to
    catch); negative steps and unknown kinds are errors.
    """
    _validate(kind, warmup_steps, total_steps, min_lr_ratio)
    _check_int("step", step, 0)
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if kind == "constant":
        return 1.0
    progress = min(1.0, max(0.0, (step - warmup_steps) / max(1, total_steps - warmup_steps)))
    if kind == "linear":
        return 1.0 - (1.0 - min_lr_ratio) * progress
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    kind: ScheduleKind,
    warmup_steps: int,
    total_steps: int,
    min_lr_ratio: float = 0.1,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` over :func:`lr_factor`; the optimizer's LR is the peak.

    Call ``scheduler.step()`` once at the end of each training step: training step ``s``
    (0-based) then runs at ``peak * lr_factor(s)``, and ``get_last_lr()`` read *after* the call
    is already the next step's LR. Its ``state_dict`` restores the position on resume.
    """
    _validate(kind, warmup_steps, total_steps, min_lr_ratio)
    factor = functools.partial(
        lr_factor,
        kind=kind,
        warmup_steps=warmup_steps,
        total_steps=total_steps,
        min_lr_ratio=min_lr_ratio,
    )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=factor)


def _default_table_steps(warmup_steps: int, total_steps: int, extra: tuple[int, ...]) -> list[int]:
    last = total_steps - 1
    candidates = {0, warmup_steps - 1, warmup_steps, total_steps // 4, total_steps // 2}
    candidates |= {(3 * total_steps) // 4, last, *extra}
    return sorted(s for s in candidates if 0 <= s <= last)


def schedule_table(
    peak_lr: float,
    *,
    kind: ScheduleKind,
    warmup_steps: int,
    total_steps: int,
    min_lr_ratio: float = 0.1,
    steps: list[int] | None = None,
) -> list[tuple[int, float]]:
    """``(step, lr)`` pairs at ``steps`` (default: start, warm-up edges, quarters, last step)."""
    if not isinstance(peak_lr, int | float) or not math.isfinite(peak_lr) or peak_lr <= 0:
        raise ValueError(f"peak_lr must be a finite number > 0, got {peak_lr!r}")
    _validate(kind, warmup_steps, total_steps, min_lr_ratio)
    chosen = steps if steps is not None else _default_table_steps(warmup_steps, total_steps, ())
    return [
        (
            s,
            peak_lr
            * lr_factor(
                s,
                kind=kind,
                warmup_steps=warmup_steps,
                total_steps=total_steps,
                min_lr_ratio=min_lr_ratio,
            ),
        )
        for s in chosen
    ]


@dataclass(frozen=True)
class PreflightResult:
    """Outcome of :func:`preflight_check`.

    ``ok`` is False when the highest LR reached by ``check_step`` is below
    ``min_fraction * peak_lr``; ``lr_at_check`` is the LR at ``check_step`` itself; ``table``
    holds ``(step, lr)`` rows for printing.
    """

    ok: bool
    lr_at_check: float
    message: str
    table: list[tuple[int, float]]
    peak_lr: float
    check_step: int
    max_lr_by_check: float


def preflight_check(
    peak_lr: float,
    *,
    check_step: int = 20,
    min_fraction: float = 0.3,
    kind: ScheduleKind,
    warmup_steps: int,
    total_steps: int,
    min_lr_ratio: float = 0.1,
) -> PreflightResult:
    """Check the schedule reaches ``min_fraction`` of the peak LR by ``check_step``.

    The criterion is the *highest* LR over steps ``0..check_step``, not the LR at ``check_step``
    alone: a short cosine run may legitimately have decayed below 30% by step 20, and that is
    not the failure this check exists for (a warmup so long the LR never gets going). For a run
    shorter than ``check_step`` the last step is checked instead.
    """
    _check_int("check_step", check_step, 0)
    if not isinstance(min_fraction, int | float) or not 0.0 < min_fraction <= 1.0:
        raise ValueError(f"min_fraction must be a number in (0, 1], got {min_fraction!r}")
    _validate(kind, warmup_steps, total_steps, min_lr_ratio)
    checked = min(check_step, total_steps - 1)

    def lrs(steps: list[int]) -> list[tuple[int, float]]:
        return schedule_table(
            peak_lr,
            kind=kind,
            warmup_steps=warmup_steps,
            total_steps=total_steps,
            min_lr_ratio=min_lr_ratio,
            steps=steps,
        )

    by_check = lrs(list(range(checked + 1)))
    best_step, best_lr = max(by_check, key=lambda row: row[1])
    lr_at_check = by_check[-1][1]
    table = lrs(_default_table_steps(warmup_steps, total_steps, (checked,)))
    needed = min_fraction * peak_lr
    where = f"step {checked}" + (
        f" (the run has only {total_steps} steps)" if checked != check_step else ""
    )
    if best_lr >= needed:
        ok = True
        message = (
            f"OK: LR reaches {best_lr / peak_lr:.0%} of peak by step {best_step}; at {where} "
            f"it is {lr_at_check:.3g} ({lr_at_check / peak_lr:.0%} of peak {peak_lr:.3g})."
        )
    else:
        ok = False
        # Linear warm-up gives (c + 1) / W at step c, so W <= (c + 1) / min_fraction passes.
        longest_ok = math.floor((checked + 1) / min_fraction)
        message = (
            f"FAIL: by {where} the LR has reached only {best_lr:.3g} = {best_lr / peak_lr:.0%} "
            f"of peak {peak_lr:.3g} (needs {min_fraction:.0%}); warmup_steps={warmup_steps} "
            f"of total_steps={total_steps} is too long. Use warmup_steps <= {longest_ok}."
        )
    return PreflightResult(ok, lr_at_check, message, table, float(peak_lr), checked, best_lr)


def format_preflight(result: PreflightResult) -> str:
    """A readable table of the schedule plus the verdict, for printing before training."""
    lines = [f"{'step':>8}  {'lr':>10}  {'of peak':>7}"]
    for step, lr in result.table:
        marker = "  <- check" if step == result.check_step else ""
        lines.append(f"{step:>8}  {lr:>10.3e}  {lr / result.peak_lr:>7.1%}{marker}")
    lines.append(result.message)
    return "\n".join(lines)


def steps_per_run(
    num_prompts: int,
    prompts_per_step: int,
    epochs: int,
    max_steps: int | None = None,
    *,
    drop_last: bool = True,
) -> int:
    """Number of training steps: ``num_prompts // prompts_per_step * epochs``, capped at max_steps.

    ``drop_last=False`` counts a final partial batch per epoch (ceil instead of floor), as
    trainers that count episodes do (``pool * n_samples // train_batch * episodes``).
    """
    _check_int("num_prompts", num_prompts, 1)
    _check_int("prompts_per_step", prompts_per_step, 1)
    _check_int("epochs", epochs, 1)
    if max_steps is not None:
        _check_int("max_steps", max_steps, 1)
    per_epoch = (
        num_prompts // prompts_per_step if drop_last else -(-num_prompts // prompts_per_step)
    )
    if per_epoch == 0:
        raise ValueError(
            f"num_prompts={num_prompts} is fewer than prompts_per_step={prompts_per_step}: "
            "not one full step per epoch (use drop_last=False or a smaller batch)"
        )
    total = per_epoch * epochs
    return min(total, max_steps) if max_steps is not None else total


def warmup_steps_from_ratio(ratio: float, total_steps: int) -> int:
    """``ceil(ratio * total_steps)``, the usual reading of a ``warmup_ratio`` setting."""
    if not isinstance(ratio, int | float) or not 0.0 <= ratio <= 1.0:
        raise ValueError(f"warmup ratio must be a number in [0, 1], got {ratio!r}")
    _check_int("total_steps", total_steps, 1)
    return math.ceil(ratio * total_steps)


def run_preflight(train_cfg, check_step: int | None = None) -> PreflightResult:
    """:func:`preflight_check` with a run's ``train`` section (``train.preflight_step`` unless
    ``check_step`` is given, capped at ``train.max_steps``): the one call the trainer, ``rlvr
    preflight`` and ``rlvr train --dry-run`` share."""
    t = train_cfg
    step = t.preflight_step if check_step is None else check_step
    return preflight_check(
        t.lr,
        check_step=min(step, t.max_steps),
        min_fraction=t.preflight_min_fraction,
        kind=t.schedule,
        warmup_steps=t.warmup_steps,
        total_steps=t.max_steps,
        min_lr_ratio=t.min_lr_ratio,
    )
