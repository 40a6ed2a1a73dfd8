"""Settings of the health gate: one sub-model per rule, each with ``enabled`` and ``action``.

The rules are early smoke-test criteria (do not wait 20 episodes to detect a problem), two that
catch failures that are otherwise silent (engine/trainer log-prob mismatch) and a guard against
an update loop that keeps skipping non-finite steps, plus alarms for the quiet failures of runs
that look fine: entropy or length collapse, exploding ratios, KL and grad-norm spikes, and
training reward rising while a held-out metric falls.

``action`` decides what the trainer does when a rule fires: ``warn`` logs the event and goes on,
``stop`` writes ``health.json`` and ends the run with a non-zero exit. Stop is the default only
where continuing cannot produce a useful model; everything else warns, because on a small or
unusual task the same symptom can be harmless.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Action = Literal["warn", "stop"]
ACTIONS: tuple[str, ...] = ("warn", "stop")


class _Rule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="Evaluate this rule (false turns it off).")


class RewardStuckRule(_Rule):
    """``reward_mean`` at its floor or ceiling for ``window`` consecutive steps."""

    low: float = Field(0.0, description="Lowest possible reward (the 'stuck at 0' level).")
    high: float = Field(1.0, description="Highest possible reward (the 'stuck at 1' level).")
    eps: float = Field(
        1e-6,
        ge=0.0,
        description="Tolerance: reward_mean <= low + eps or >= high - eps counts as stuck.",
    )
    action: Action = Field(
        "stop",
        description=(
            "Default stop: a batch whose rewards are all equal gives every group zero "
            "advantage, so no step can learn anything; stuck at the floor is almost always "
            "a data or reward bug, stuck at the ceiling means the prompts are too easy."
        ),
    )

    @model_validator(mode="after")
    def _low_below_high(self) -> RewardStuckRule:
        if not self.low < self.high:
            raise ValueError(f"reward_stuck: low ({self.low}) must be < high ({self.high})")
        return self


class HasBoxedRule(_Rule):
    """``has_boxed`` below a floor or falling; checked only on steps that log ``has_boxed``, in
    runs whose prompts ask for a boxed answer (``rlvr.data.templates.asks_for_boxed``)."""

    min_value: float = Field(
        0.5, ge=0.0, le=1.0, description="Fire when the fraction with \\boxed{} is below this."
    )
    max_drop: float = Field(
        0.25,
        gt=0.0,
        le=1.0,
        description=(
            "Fire when has_boxed is more than this far below its highest value over the "
            "previous `window` steps (the format is being lost)."
        ),
    )
    action: Action = Field(
        "warn",
        description=(
            "Default warn: a reward that also accepts the last number still learns without "
            "boxes. Never checked where no prompt asks for a box (the built-in arithmetic)."
        ),
    )


class GradNormZeroRule(_Rule):
    """``grad_norm`` zero for ``window`` consecutive steps (nothing is being trained)."""

    tolerance: float = Field(0.0, ge=0.0, description="grad_norm <= tolerance counts as zero.")
    action: Action = Field(
        "stop",
        description=(
            "Default stop: a zero gradient for several steps means frozen or detached "
            "weights (or no advantage signal at all); the run would burn compute unchanged."
        ),
    )


class GradNormHighRule(_Rule):
    """``grad_norm`` (before clipping) above ``max_value``."""

    max_value: float = Field(
        100.0, gt=0.0, description="Fire when grad_norm before clipping exceeds this."
    )
    action: Action = Field(
        "warn",
        description=(
            "Default warn: single spikes are clipped and often harmless; a run that keeps "
            "firing needs a lower learning rate or a tighter ratio clip."
        ),
    )


class AdvStdZeroRule(_Rule):
    """``adv_std`` zero for ``window`` consecutive steps."""

    tolerance: float = Field(1e-8, ge=0.0, description="adv_std <= tolerance counts as zero.")
    action: Action = Field(
        "warn",
        description=(
            "Default warn: when rewards are all equal the reward_stuck rule already stops the "
            "run; otherwise this points at an advantage bug worth a look, not a certain failure."
        ),
    )


class TruncationRule(_Rule):
    """``truncation_rate`` above ``max_rate``."""

    max_rate: float = Field(
        0.5, ge=0.0, le=1.0, description="Fire when more than this fraction of responses is cut."
    )
    action: Action = Field(
        "warn",
        description=(
            "Default warn: truncation costs reward but training can still progress; raise "
            "the generation limit when it persists."
        ),
    )


class ClipFracRule(_Rule):
    """Clipped-token fraction ``clip_frac_low + clip_frac_high`` above ``max_frac``."""

    max_frac: float = Field(
        0.4, ge=0.0, le=1.0, description="Fire when the total clipped fraction exceeds this."
    )
    action: Action = Field(
        "warn",
        description="Default warn: aggressive updates, usually a learning rate a bit too high.",
    )


class LogprobMismatchRule(_Rule):
    """Engine vs trainer log-probs of the sampled tokens disagree (judged only on batches the
    trainer's current weights sampled: a stale batch's gap is the policy's own change too)."""

    max_abs_diff: float = Field(
        5.0,
        gt=0.0,
        description=(
            "Fire when |logprob_diff_max| (largest per-token difference) exceeds this; bf16 "
            "kernels differ by well under 1 nat, a misaligned gather by ~10."
        ),
    )
    max_k3: float = Field(
        0.1,
        gt=0.0,
        description="Fire when logprob_k3 (per-token k3 distance, mean) exceeds this.",
    )
    action: Action = Field(
        "warn",
        description=(
            "Default warn: precision differences between engine and trainer are expected and "
            "harmless in moderation; a large value needs a look, not an automatic stop."
        ),
    )


class NonfiniteRule(_Rule):
    """Non-finite loss or gradients on more than ``max_consecutive`` steps in a row."""

    max_consecutive: int = Field(
        2,
        ge=0,
        description=(
            "Fire when this many consecutive steps were non-finite and the next one is too "
            "(nonfinite_skipped = 1, or policy_loss / grad_norm NaN or inf)."
        ),
    )
    action: Action = Field(
        "stop",
        description=(
            "Default stop: each non-finite step is skipped, so a run of them means training "
            "has stopped progressing; one isolated skip is tolerated."
        ),
    )


class EntropyCollapseRule(_Rule):
    """``entropy_mean`` below a floor, or fallen by ``max_drop`` of its highest value over the
    previous ``window`` steps (the policy stops exploring)."""

    min_entropy: float = Field(
        0.02, ge=0.0, description="Fire when entropy_mean (nats per token) is below this."
    )
    max_drop: float = Field(
        0.9,
        gt=0.0,
        le=1.0,
        description=(
            "Fire when entropy_mean fell by more than this fraction of its highest value over "
            "the previous `window` steps (0.9: to a tenth). The demo's converging run fell by "
            "at most 0.83 over 5 steps."
        ),
    )
    action: Action = Field(
        "warn",
        description=(
            "Default warn: a policy that has solved an easy task is confident too; a collapse "
            "on a task it has not solved needs a higher entropy_coef, temperature or clip_high."
        ),
    )


class LengthCollapseRule(_Rule):
    """Median reply length (``response_len_p50``) down by ``max_drop`` from its value at the first
    checked step while ``reward_mean`` has not improved (stuck or falling): the policy is
    degenerating into short replies. Replies that shrink while the reward climbs are a model
    learning to answer directly (the demo's 40 -> 10 tokens), not a collapse; a reward that
    climbs on short replies the held-out metric does not follow is train_eval_divergence's."""

    max_drop: float = Field(
        0.75,
        gt=0.0,
        lt=1.0,
        description=(
            "Fire when response_len_p50 is below (1 - max_drop) x its value at the first "
            "checked step (after warm-up) and the reward has not improved (min_reward_gain)."
        ),
    )
    min_reward_gain: float = Field(
        0.05,
        ge=0.0,
        description="reward_mean has improved when it is at least baseline + this; below, a "
        "length drop fires.",
    )
    action: Action = Field(
        "warn",
        description=(
            "Default warn: shorter answers can be a good thing (a model that stops rambling); "
            "read samples to tell that from one-step answers that fool the reward."
        ),
    )


class RatioExplosionRule(_Rule):
    """Importance ratios out of bounds: ``ratio_max`` above ``max_ratio`` or ``log_ratio_abs_p99``
    above ``max_log_ratio_p99`` on ``steps`` consecutive steps."""

    max_ratio: float = Field(10.0, gt=1.0, description="Fire when ratio_max exceeds this.")
    max_log_ratio_p99: float = Field(
        5.0, gt=0.0, description="Fire when log_ratio_abs_p99 (|log pi/pi_old|, p99) exceeds this."
    )
    steps: int = Field(2, ge=1, description="Consecutive steps the condition must hold.")
    action: Action = Field(
        "stop",
        description=(
            "Default stop: with ratios this far from 1 on consecutive steps the policy no "
            "longer matches the samples it learns from (stale engine weights, misaligned "
            "log-probs, a learning rate far too high); more steps only diverge further."
        ),
    )


class KLSpikeRule(_Rule):
    """``kl`` above ``factor`` times its running median over the previous ``history`` steps."""

    factor: float = Field(5.0, gt=1.0, description="Fire when kl > factor x running median.")
    history: int = Field(
        10, ge=3, description="Steps in the running median (fires only once it has 3 values)."
    )
    min_kl: float = Field(
        1e-3, ge=0.0, description="Ignore KL values below this (near 0 any ratio is noise)."
    )
    action: Action = Field(
        "warn",
        description=(
            "Default warn: a KL jump often follows one aggressive step and recovers; repeated "
            "spikes want a lower learning rate or a larger beta."
        ),
    )


class GradSpikesRule(_Rule):
    """Three grad-norm spikes within ``within`` steps, each larger than the one before (a spike:
    ``grad_norm`` above ``factor`` times its running median)."""

    factor: float = Field(3.0, gt=1.0, description="A spike is grad_norm > factor x median.")
    within: int = Field(10, ge=3, description="The three spikes must fall within this many steps.")
    min_norm: float = Field(
        1.0,
        ge=0.0,
        description=(
            "A spike must also exceed this (the default train.max_grad_norm): a small gradient "
            "norm that grows as a healthy run starts to learn (0.04 -> 0.09 -> 0.3) is no spike."
        ),
    )
    action: Action = Field(
        "stop",
        description=(
            "Default stop: spikes that keep growing are the run diverging; clipping hides "
            "them from the update for a while, not for long."
        ),
    )


class TrainEvalDivergenceRule(_Rule):
    """Training reward up while a held-out metric falls, over two consecutive evaluations."""

    metric: str | None = Field(
        None,
        description=(
            "The eval metric to watch, as logged (eval/<set>/<metric>); None: the first such "
            "key in sorted order (e.g. eval/heldout/greedy_pass@1)."
        ),
    )
    min_drop: float = Field(
        0.0, ge=0.0, description="Each of the two evals must fall by more than this."
    )
    action: Action = Field(
        "warn",
        description=(
            "Default warn: the training reward is being earned in a way that does not carry "
            "over (overfitting or reward hacking); compare samples from both."
        ),
    )


class HealthConfig(BaseModel):
    """Health-gate settings: warm-up, window length and one sub-model per rule."""

    model_config = ConfigDict(extra="forbid")

    warmup_steps: int = Field(
        5,
        ge=0,
        description=(
            "Steps with step < warmup_steps are not checked (early metrics are noisy and "
            "windows start counting after warm-up)."
        ),
    )
    window: int = Field(
        5,
        ge=1,
        description="Consecutive checked steps a 'stuck' condition must hold before it fires.",
    )
    reward_stuck: RewardStuckRule = Field(
        default_factory=RewardStuckRule, description="reward_mean stuck at 0 or 1."
    )
    has_boxed: HasBoxedRule = Field(
        default_factory=HasBoxedRule, description="has_boxed below 0.5 or falling."
    )
    grad_norm_zero: GradNormZeroRule = Field(
        default_factory=GradNormZeroRule, description="grad_norm zero for `window` steps."
    )
    grad_norm_high: GradNormHighRule = Field(
        default_factory=GradNormHighRule, description="grad_norm above a ceiling."
    )
    adv_std_zero: AdvStdZeroRule = Field(
        default_factory=AdvStdZeroRule, description="adv_std zero for `window` steps."
    )
    truncation: TruncationRule = Field(
        default_factory=TruncationRule, description="truncation_rate above 0.5."
    )
    clip_frac: ClipFracRule = Field(
        default_factory=ClipFracRule, description="clip_frac_low + clip_frac_high above 0.4."
    )
    logprob_mismatch: LogprobMismatchRule = Field(
        default_factory=LogprobMismatchRule,
        description="Engine vs trainer log-prob mismatch above threshold.",
    )
    nonfinite: NonfiniteRule = Field(
        default_factory=NonfiniteRule,
        description="Non-finite loss or gradients several steps in a row.",
    )
    entropy_collapse: EntropyCollapseRule = Field(
        default_factory=EntropyCollapseRule, description="entropy_mean near 0 or falling fast."
    )
    length_collapse: LengthCollapseRule = Field(
        default_factory=LengthCollapseRule,
        description="Median reply length collapsing while reward holds.",
    )
    ratio_explosion: RatioExplosionRule = Field(
        default_factory=RatioExplosionRule, description="ratio_max > 10 or |log-ratio| p99 > 5."
    )
    kl_spike: KLSpikeRule = Field(
        default_factory=KLSpikeRule, description="kl above 5x its running median."
    )
    grad_spikes: GradSpikesRule = Field(
        default_factory=GradSpikesRule, description="Three growing grad-norm spikes."
    )
    train_eval_divergence: TrainEvalDivergenceRule = Field(
        default_factory=TrainEvalDivergenceRule,
        description="Training reward up, held-out metric down over two evals.",
    )
