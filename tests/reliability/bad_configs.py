"""Hypothesis strategies for malformed run-config values: ``(dotted knob, bad value)`` pairs.

Each entry of ``BAD_VALUES`` is a knob and a strategy of values its documented rule forbids (a
range from its Field, a set of known names, or a cross-knob rule of
``rlvr.config.validate.problems``). A value of the wrong type (a list, a mapping, a word where a
number belongs) is malformed for every numeric knob. ``NONFINITE_FLOAT_KNOBS`` are the float
knobs where NaN or an infinity cannot mean anything a run can use (see the comment there).
"""

from __future__ import annotations

import json
import math

from hypothesis import strategies as st

from rlvr.objectives import OBJECTIVES

_WORDS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=12)
_FINITE = {"allow_nan": False, "allow_infinity": False}


def _not_in(known: tuple[str, ...] | list[str]) -> st.SearchStrategy[str]:
    return _WORDS.filter(lambda w: w not in known)


def _floats(**bounds: float) -> st.SearchStrategy[float]:
    return st.floats(**bounds, **_FINITE)


BAD_VALUES: dict[str, st.SearchStrategy] = {
    "algo.objective": _not_in(OBJECTIVES),
    "algo.group_size": st.integers(max_value=1),  # group baselines need 2+ samples
    "algo.prompts_per_step": st.integers(max_value=0),
    "algo.minibatches": st.integers(max_value=0),
    "algo.micro_batch_size": st.integers(max_value=0),
    "algo.epochs_per_batch": st.integers(max_value=0),
    "algo.clip_low": _floats(max_value=-1e-9),
    "algo.clip_high": _floats(max_value=-1e-9),
    "algo.dual_clip": _floats(max_value=1.0),  # must be > 1
    "algo.beta": _floats(max_value=-1e-9),
    "algo.loss_agg": _not_in(
        ["auto", "token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
    ),
    "algo.kl_estimator": _not_in(["k1", "k2", "k3"]),
    "algo.kl_mode": _not_in(["loss", "reward"]),
    "algo.tis_cap": _floats(max_value=0.0),  # a cap must be > 0 (null turns it off)
    "algo.dynamic_sampling_max_rounds": st.integers(max_value=0),
    "algo.ppo.lam": st.one_of(_floats(max_value=-1e-9), _floats(min_value=1.0 + 1e-9)),
    "train.lr": _floats(max_value=0.0),
    "train.max_steps": st.integers(max_value=0),
    "train.warmup_steps": st.integers(max_value=-1),
    "train.schedule": _not_in(["constant", "cosine", "linear"]),
    "train.min_lr_ratio": st.one_of(_floats(max_value=-1e-9), _floats(min_value=1.0 + 1e-9)),
    "train.weight_decay": _floats(max_value=-1e-9),
    "train.max_grad_norm": _floats(max_value=0.0),
    "train.save_every": st.integers(max_value=-1),
    "train.max_checkpoints": st.integers(max_value=0),
    # Adam's betas live in [0, 1): torch refuses anything else, but only once the model is loaded
    "train.adam_betas": st.tuples(
        st.one_of(_floats(max_value=-1e-9), _floats(min_value=1.0)),
        _floats(min_value=0.0, max_value=0.999),
    ).map(list),
    "rollout.engine": _not_in(["hf", "vllm", "auto"]),
    "rollout.temperature": _floats(max_value=-1e-9),
    "rollout.top_p": st.one_of(_floats(max_value=0.0), _floats(min_value=1.0 + 1e-9)),
    "rollout.top_k": st.integers(max_value=-1),
    "rollout.max_new_tokens": st.integers(max_value=0),
    "data.task": _not_in(["arithmetic", "countdown", "file"]),
    "data.template": _not_in(["chat", "r1", "qwen_math", "none"]),
    "data.max_prompt_tokens": st.integers(max_value=0),
    "data.num_train": st.integers(max_value=0),
    "model.dtype": _not_in(["float32", "bfloat16"]),
    "model.lora.rank": st.integers(max_value=0),
    "model.lora.dropout": st.one_of(_floats(max_value=-1e-9), _floats(min_value=1.0)),
    "reward.timeout_s": _floats(max_value=0.0),
    "reward.max_failure_fraction": st.one_of(
        _floats(max_value=-1e-9), _floats(min_value=1.0 + 1e-9)
    ),
    "reward.overlong_buffer": st.integers(max_value=-1),
    "reward.overlong_factor": _floats(max_value=-1e-9),
    "reward.specs": st.one_of(
        _not_in(["math", "gsm8k", "countdown", "psgrpo", "math_prm"]).map(lambda w: [{"name": w}]),
        _WORDS.map(lambda w: [{"name": f"no_such_module_{w}:fn"}]),
        st.just([{"name": "math", "kwargs": {"no_such_option": 1}}]),
        st.just([{"name": "math", "weight": "heavy"}]),
    ),
    "logging.samples_every": st.integers(max_value=-1),
    "health.window": st.integers(max_value=0),
    "health.warmup_steps": st.integers(max_value=-1),
    "health.nonfinite.action": _not_in(["warn", "stop"]),
    "health.nonfinite.max_consecutive": st.integers(max_value=-1),
    "eval.early_stop.patience": st.integers(max_value=0),
}

NUMERIC_KNOBS = [
    "algo.group_size",
    "algo.prompts_per_step",
    "algo.clip_low",
    "train.lr",
    "train.max_steps",
    "rollout.temperature",
    "rollout.top_p",
    "rollout.max_new_tokens",
    "reward.timeout_s",
    "reward.max_failure_fraction",
    "health.window",
]


def _spells_a_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


WRONG_TYPES = st.one_of(
    st.lists(st.integers(), min_size=1, max_size=3),
    st.dictionaries(_WORDS, st.integers(), min_size=1, max_size=2),
    # words that are not numbers: pydantic reads a numeric string ("0.2", "0e0", "inf") as the
    # number it spells, which is fine for a config value, so those are not "wrong types"
    _WORDS.filter(lambda w: not _spells_a_number(w)),
)

# NaN is never a setting. An infinity is not one either for these knobs: an infinite learning
# rate, temperature, KL coefficient or entropy bonus turns the first update into NaNs, and an
# infinite reward timeout_s crashes the reward pool (select() cannot wait forever) instead of
# meaning "no limit". (Knobs where infinity reads as "no limit", such as train.max_grad_norm,
# are left out.)
NONFINITE_FLOAT_KNOBS = [
    "train.lr",
    "train.weight_decay",
    "rollout.temperature",
    "algo.beta",
    "algo.entropy_coef",
    "algo.adv_eps",
    "algo.maxent.tau",
    "algo.maxent.q_temperature",
    "algo.maxent.q_eps",
    "algo.ppo.value_lr",
    "algo.ppo.value_coef",
    "reward.timeout_s",
    "reward.overlong_factor",
]


def override(knob: str, value: object) -> str:
    """``knob=value`` as a command-line override (JSON is YAML, so every value reads back)."""
    if isinstance(value, float) and not math.isfinite(value):
        text = ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    else:
        text = json.dumps(value)
    return f"{knob}={text}"


def nested(knob: str, value: object) -> dict:
    """``{"a": {"b": value}}`` for knob "a.b": the same setting as a YAML config file holds it."""
    out: dict = {}
    node = out
    parts = knob.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out
