"""What to check or change when a health rule fires (a GRPO tuning playbook, in our words).

Each entry is a format string; the gate fills in the numbers it observed.
"""

from __future__ import annotations

ADVICE: dict[str, str] = {
    "reward_stuck_low": (
        "reward_mean has sat at its minimum ({low}) for {steps} steps: no completion is "
        "rewarded, every group has zero variance and nothing can be learned. This is usually a "
        "data or reward bug: read a few samples and check the answer extraction against the "
        "reference (right reference field? does the reward parse the format the template asks "
        "for?). If the rewards are right, the task is too hard for this model: use easier "
        "prompts or a curriculum, or a larger group size."
    ),
    "reward_stuck_high": (
        "reward_mean has sat at its maximum ({high}) for {steps} steps: every completion is "
        "rewarded, so every group has zero variance and nothing is learned. The prompts are "
        "too easy: use harder ones, or filter out prompts the base model always solves."
    ),
    "has_boxed_low": (
        "Only {has_boxed:.0%} of responses contain \\boxed{{}} (floor {min_value:.0%}): the "
        "reward cannot grade answers it cannot find. Check that the template asks for a boxed "
        "answer and that responses are not cut off before the answer (truncation_rate); if "
        "the base model rarely boxes, run a short SFT phase on the answer format first."
    ),
    "has_boxed_falling": (
        "The \\boxed{{}} rate fell from {recent_max:.0%} to {has_boxed:.0%} within {window} "
        "steps: the model is losing the answer format. Read recent samples; lower the "
        "learning rate or add a KL penalty, or run a small SFT phase on the format."
    ),
    "grad_norm_zero": (
        "grad_norm has been zero for {steps} steps: no weight is changing. Check that there "
        "are trainable parameters (LoRA target modules matched, nothing frozen by mistake), "
        "that the loss is connected to the model (not computed from detached tensors), and "
        "that some groups carry an advantage (zero_var_group_frac below 1). After a far too "
        "large learning rate the weights can saturate the softmax so that every gradient "
        "underflows to zero: check the lr (rlvr preflight)."
    ),
    "grad_norm_high": (
        "grad_norm before clipping is {grad_norm:.4g} (ceiling {max_value:.4g}): clipping "
        "dominates the update and the learning rate is probably too high. Lower it. Spikes "
        "come from extreme log-probability ratios on a few tokens (see log_ratio_max, "
        "ratio_max and spikes.jsonl), not from advantage outliers: tighten the ratio clip "
        "(e.g. 0.2 -> 0.1) or clamp log-ratios; clipping advantages does not help."
    ),
    "adv_std_zero": (
        "adv_std has been zero for {steps} steps: no completion is preferred over another, "
        "so the policy gradient is zero. If rewards do vary inside groups (reward_std > 0), "
        "the advantage computation is wrong: check the group size and that completions are "
        "grouped with their own prompt. Otherwise every group got identical rewards (see "
        "zero_var_group_frac): change the task difficulty or the group size."
    ),
    "truncation": (
        "{truncation_rate:.0%} of responses hit the generation limit (ceiling "
        "{max_rate:.0%}), so answers are cut off before they are written. Raise "
        "rollout.max_new_tokens (and eval.max_new_tokens for evaluations), or add a length "
        "penalty (reward.overlong_buffer) if the model rambles."
    ),
    "clip_frac": (
        "{clip_frac:.0%} of tokens had their ratio clipped (ceiling {max_frac:.0%}): the "
        "updates are too aggressive. Lower the learning rate or take fewer update passes per "
        "batch; if this holds from the first steps, the learning rate is too high."
    ),
    "logprob_mismatch": (
        "The rollout engine's log-probs of the sampled tokens disagree with the trainer's "
        "({detail}). Either the engine is not running the latest weights (check the weight "
        "sync), or the trainer's log-probs are not aligned with the sampled tokens (an "
        "off-by-one between logits and labels silently corrupts every ratio and KL value). "
        "Precision differences alone give small values. Compare the two on one batch before "
        "trusting ratio or KL metrics. A real, steady gap (different kernels or precision in "
        "the engine) makes the samples slightly off-policy: algo.rollout_correction.level=token "
        "(action=truncate, cap=2) reweights each token by the truncated trainer/engine ratio."
    ),
    "entropy_low": (
        "entropy_mean is {entropy_mean:.3g} nats per token (floor {min_entropy:.3g}): the "
        "policy samples almost deterministically, so groups stop differing and exploration "
        "ends. If the task is not solved yet, raise algo.entropy_coef, the sampling "
        "temperature or algo.clip_high (clip-higher keeps low-probability tokens alive)."
    ),
    "entropy_falling": (
        "entropy_mean fell from {recent_max:.3g} to {entropy_mean:.3g} within {steps} steps: "
        "the policy is collapsing onto a few replies. Lower the learning rate, raise "
        "algo.clip_high or algo.entropy_coef, and read samples: a collapse onto one reply "
        "that the reward likes is often reward hacking."
    ),
    "length_collapse": (
        "The median reply length fell from {baseline_len:.0f} to {response_len_p50:.0f} tokens "
        "while reward_mean did not improve ({baseline_reward:.3g} -> {reward_mean:.3g}): the "
        "policy is collapsing into short replies that earn no more. Read samples; lower the "
        "learning rate, check the length penalty or overlong shaping, and that the reward does "
        "not pay for a bare guess."
    ),
    "ratio_explosion": (
        "Importance ratios are far from 1 for {steps} steps (ratio_max {ratio_max:.3g}, "
        "|log-ratio| p99 {p99:.3g}): the policy being updated is not the one that sampled. "
        "Check the engine's weight sync (logprob_diff_max, policy_version), lower the "
        "learning rate or the number of update passes per batch, tighten the ratio clip."
    ),
    "kl_spike": (
        "kl jumped to {kl:.3g}, {factor:g}x its running median {running_median:.3g}: one "
        "update moved the policy far from the reference. Lower the learning rate, raise "
        "algo.beta (or use algo.kl_target), and check spikes.jsonl for the prompts involved."
    ),
    "grad_spikes": (
        "Three grad-norm spikes within {within} steps, each larger than the last ({norms}): "
        "the run is diverging. Lower the learning rate, tighten the ratio clip or the "
        "gradient clip, and look at log_ratio_max and spikes.jsonl for the tokens behind it."
    ),
    "train_eval_divergence": (
        "Training reward rose ({r0:.3g} -> {r2:.3g}) while {metric} fell ({e0:.3g} -> {e2:.3g}) "
        "over two evaluations: what the policy learns does not carry over. Suspect reward "
        "hacking or overfitting to the training prompts: compare training and held-out "
        "samples, and keep the best checkpoint (eval.save_best)."
    ),
    "nonfinite": (
        "The loss or gradients were non-finite on {steps} consecutive steps, so updates are "
        "skipped and training has stopped progressing. Lower the learning rate, use float32 "
        "or bfloat16 rather than float16, clamp log-ratios, and check rewards and advantages "
        "for NaN values."
    ),
}
