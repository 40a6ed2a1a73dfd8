"""An unknown key gets what a peer framework (TRL, verl, OpenRLHF) means by it, or a real key it
is a typo of; never a key that only shares words with it. Typos inside list items (reward specs)
get the same help."""

from __future__ import annotations

import pytest

from rlvr.config import ConfigError, known_keys, load_config
from rlvr.config.sections import Config


def refusal(*overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(None, list(overrides))
    return str(err.value)


# (override, the rlvr key it means) for the peers' names that have an equivalent
EQUIVALENTS = [
    ("per_device_train_batch_size=2", "algo.micro_batch_size"),  # TRL
    ("train.per_device_train_batch_size=2", "algo.micro_batch_size"),
    ("total_training_steps=3", "train.max_steps"),  # verl trainer.total_training_steps
    ("trainer.total_training_steps=3", "train.max_steps"),
    ("data.train_batch_size=8", "algo.prompts_per_step"),  # verl: prompts per step
    ("kl_loss_coef=0.001", "algo.beta"),  # verl, the KL as a loss (rlvr's default kl_mode)
    ("algo.kl_loss_coef=0.001", "algo.beta"),
    ("rollout_n=8", "algo.group_size"),
    ("rollout.n=8", "algo.group_size"),  # verl's rollout.n under rlvr's rollout section
    ("actor_rollout_ref.rollout.n=8", "algo.group_size"),  # verl's full dotted name
    ("actor_rollout_ref.actor.ppo_epochs=2", "algo.epochs_per_batch"),
    ("actor_rollout_ref.actor.kl_loss_type=low_var_kl", "algo.kl_estimator"),
    ("num_generations=8", "algo.group_size"),  # TRL
    ("max_completion_length=256", "rollout.max_new_tokens"),
    ("learning_rate=1e-6", "train.lr"),
    ("n_samples_per_prompt=8", "algo.group_size"),  # OpenRLHF
    ("rollout_batch_size=128", "algo.prompts_per_step"),
    ("micro_train_batch_size=4", "algo.micro_batch_size"),
    ("train.warmup_ratio=0.1", "train.warmup_steps"),
    # the rollout correction: TRL's vllm_importance_sampling_*, verl's rollout_is / rollout_rs
    ("vllm_importance_sampling_mode=token_mask", "algo.rollout_correction.level"),
    ("vllm_importance_sampling_clip_max=3", "algo.rollout_correction.cap"),
    ("vllm_importance_sampling_clip_min=0.5", "algo.rollout_correction.low"),
    ("algorithm.rollout_correction.rollout_is=token", "algo.rollout_correction.level"),
    ("rollout_is_threshold=2", "algo.rollout_correction.cap"),
    ("rollout_rs=token", "algo.rollout_correction.action"),
    ("rollout_rs_threshold_lower=0.5", "algo.rollout_correction.low"),
    ("model.lora.r=16", "model.lora.rank"),  # peft's LoraConfig.r (was: 'train.lr')
    ("r=16", "model.lora.rank"),
    ("loss_type=dapo", "algo.loss_agg"),  # TRL's loss_type is the loss's aggregation
    ("algo.loss_type=dr_grpo", "algo.loss_agg"),
    # verl names under a section rlvr does not have, whose tail is an rlvr key
    ("actor_rollout_ref.rollout.gpu_memory_utilization=0.6", "rollout.gpu_memory_utilization"),
    ("actor_rollout_ref.rollout.top_p=0.9", "rollout.top_p"),
    ("custom_reward_function.path=my_reward.py", "reward.specs"),  # verl's own reward
    ("custom_reward_function.name=score", "reward.specs"),
    ("algorithm.norm_adv_by_std_in_grpo=false", "algo.objective"),
    ("actor_rollout_ref.actor.use_dynamic_bsz=true", "algo.micro_batch_tokens"),
    ("trainer.project_name=p", "logging.wandb_project"),
    ("eval_steps=10", "eval.every"),  # TRL
    ("per_device_eval_batch_size=8", "eval.batch_size"),
    ("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1", "train.warmup_steps"),  # verl
    ("actor_rollout_ref.actor.optim.warmup_style=cosine", "train.schedule"),
    # asynchrony: verl's fully async recipe (async_training.*), AReaL's staleness bound
    ("async_training.partial_rollout=true", "rollout.partial"),
    ("rollout.partial_rollout=true", "rollout.partial"),
    ("async_training.staleness_threshold=0.5", "rollout.max_staleness"),
    ("max_head_offpolicyness=2", "rollout.max_staleness"),
]


@pytest.mark.parametrize("override, key", EQUIVALENTS)
def test_a_peer_name_with_an_equivalent_names_it(override: str, key: str) -> None:
    message = refusal(override)
    assert message.endswith(f"did you mean {key!r}?"), message


@pytest.mark.parametrize(
    "override, said",
    [  # names that count other things than rlvr's key: the conversion is said
        ("loss_type=dapo", "dapo -> token_mean"),
        ("loss_type=grpo", "grpo -> seq_mean_token_mean"),
        ("loss_type=dr_grpo", "dr_grpo -> seq_mean_token_sum_norm"),
        ("generation_batch_size=64", "generation_batch_size / num_generations"),
        ("steps_per_generation=4", "steps_per_generation / gradient_accumulation_steps"),
        ("algorithm.norm_adv_by_std_in_grpo=false", "false: drgrpo"),
        ("custom_reward_function.path=r.py", "'module:function'"),
        # TRL's epsilon and OpenRLHF's eps_clip bound both sides; rlvr's clip_low one
        ("epsilon=0.1", "and algo.clip_high"),
        ("eps_clip=0.1", "and algo.clip_high"),
    ],
)
def test_a_peer_name_that_counts_differently_says_how_to_convert(override: str, said: str) -> None:
    assert said in refusal(override)


@pytest.mark.parametrize(
    "override, said",
    [
        ("gradient_accumulation_steps=4", "gradient accumulation is automatic"),
        ("train.gradient_accumulation_steps=4", "micro-batches of algo.micro_batch_size"),
        ("num_train_epochs=3", "set train.max_steps"),
        ("trainer.total_epochs=3", "set train.max_steps"),
        ("logging_steps=1", "every step is logged"),
        ("log_completions=true", "logging.samples_every"),
        ("sync_ref_model=true", "the reference is the initial model"),
        ("repetition_penalty=1.1", "temperature, top_p and top_k"),
    ],
)
def test_a_peer_name_without_an_equivalent_says_so(override: str, said: str) -> None:
    message = refusal(override)
    assert "rlvr has no such knob" in message and said in message, message
    assert "did you mean" not in message


@pytest.mark.parametrize(
    "override, wrong",
    [  # what the lexical suggestion used to be: each a different knob
        ("train.per_device_train_batch_size=2", "preflight_min_fraction"),
        ("gradient_accumulation_steps=4", "warmup_steps"),
        ("total_training_steps=3", "warmup_steps"),
        ("data.train_batch_size=8", "data.train_path"),
        ("kl_loss_coef=0.1", "kl_mode"),
        ("algo.kl_loss_coef=0.1", "kl_mode"),
        ("rollout_n=4", "rollout_correction"),
    ],
)
def test_a_peer_name_is_never_answered_with_a_lookalike(override: str, wrong: str) -> None:
    suggested = refusal(override).partition("did you mean ")[2]
    assert wrong not in suggested


@pytest.mark.parametrize(
    "override, suggestion",
    [
        ("train.max_step=4", "train.max_steps"),
        ("algo.group_sise=4", "algo.group_size"),
        ("algo.maxent.tua=1", "algo.maxent.tau"),
        ("rollout.temprature=0.5", "rollout.temperature"),
        ("train.wramup_steps=2", "train.warmup_steps"),
        ("algo.prompt_per_step=2", "algo.prompts_per_step"),
    ],
)
def test_a_typo_gets_the_key_it_misspells(override: str, suggestion: str) -> None:
    assert refusal(override).endswith(f"did you mean {suggestion!r}?")


@pytest.mark.parametrize(
    "override", ["train.foo_bar_baz=1", "train.batch_size_per_gpu=2", "algo.kl_mode_x_y=1"]
)
def test_no_suggestion_below_a_near_miss(override: str) -> None:
    message = refusal(override)
    assert "did you mean" not in message and override.split("=")[0] in message


@pytest.mark.parametrize(
    "override, not_one_of",
    [  # a one-letter name is a typo of nothing ('r' -> 'lr' was one edit)
        ("train.l=1", "train.lr"),
        ("model.lora.x=1", "train.lr"),
        # a leaf that 17 sections share was answered with one of them (the last)
        ("train.enabled=true", "health.train_eval_divergence.enabled"),
        ("data.enable=true", "health.train_eval_divergence.enabled"),
        ("eval.action=stop", "health.train_eval_divergence.action"),
    ],
)
def test_no_suggestion_that_is_a_guess(override: str, not_one_of: str) -> None:
    message = refusal(override)
    assert "did you mean" not in message, message
    assert not_one_of not in message


def test_a_leaf_two_sections_share_names_both() -> None:
    message = refusal("data.max_failure_fraction=0.1")
    assert "'reward.max_failure_fraction'" in message and "'env.max_failure_fraction'" in message


@pytest.mark.parametrize(
    "override, where, suggestion",
    [
        ("reward.specs=[{name: math, weigth: 2}]", "reward.specs[0]", "weight"),
        ("reward.specs=[{name: math}, {name: x, kwarg: {}}]", "reward.specs[1]", "kwargs"),
        ("reward.specs=[{name: math, nmae: x}]", "reward.specs[0]", "name"),
    ],
)
def test_a_typo_inside_a_reward_spec_is_named_with_a_suggestion(
    override: str, where: str, suggestion: str
) -> None:
    message = refusal(override)
    assert f"{where}: unknown key" in message and f"did you mean {suggestion!r}?" in message
    assert "Extra inputs are not permitted" not in message


def test_every_mapped_key_is_a_real_key() -> None:
    from rlvr.config.peer_names import PEER_NAMES

    known = set(known_keys(Config))
    assert {key for key, _ in PEER_NAMES.values() if key is not None} <= known


@pytest.mark.parametrize(
    "override, said",
    [  # a section given one value, as TRL's model= / data files are given
        ("model=Qwen/Qwen2.5-0.5B", "did you mean 'model.name_or_path=Qwen/Qwen2.5-0.5B'?"),
        ("data=train.jsonl", "did you mean 'data.train_path=train.jsonl'?"),
        # TRL's reward_funcs is a list of functions; rlvr's specs are mappings
        ("reward.specs=['my_reward:score']", "write it as {name: 'my_reward:score'}"),
    ],
)
def test_a_value_where_a_mapping_belongs_says_how_to_write_it(override: str, said: str) -> None:
    assert said in refusal(override)
