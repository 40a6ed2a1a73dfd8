"""The engine samples and evaluates with the weights of the step it is labelled with.

``CopyEngine`` is the transformers engine over its own copy of the weights: like vLLM it holds
whatever it was last given, so a missed sync shows (the real engine is tested the same way in
tests/rollout/test_vllm_versions.py). Bugs these catch: the engine was built from the base
weights before a checkpoint was restored (the first resumed step sampled from the wrong
policy), and with ``rollout.sync_every > 1`` evaluations measured older weights than their step.
"""

from __future__ import annotations

import copy
import json

import pytest
from test_train_e2e import tiny_config

from rlvr.data.rows import reward_specs
from rlvr.eval.evaluator import evaluate_sets
from rlvr.eval.sets import build_eval_sets
from rlvr.rewards.runner import RewardRunner
from rlvr.rollout.hf import HFEngine
from rlvr.training.trainer import Trainer


class CopyEngine(HFEngine):
    def __init__(self, model, tokenizer):
        super().__init__(copy.deepcopy(model), tokenizer)
        self.shares_weights = False  # it holds its own copy of the weights, as vLLM does
        self.loads = 0

    def load_weights(self, named_tensors) -> None:
        self.model.load_state_dict(dict(named_tensors))
        self.loads += 1


def _with_copy_engine(cfg) -> Trainer:
    trainer = Trainer(cfg)
    trainer.run.engine.close()
    engine = CopyEngine(trainer.model, trainer.tokenizer)
    trainer.run.engine = engine
    return trainer


COMMON = ("model.autocast=off", "train.lr=1e-2", "train.preflight_step=0", "algo.group_size=4")


def _rows(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_first_resumed_step_samples_from_the_restored_weights(tiny_model_dir, tmp_path):
    first = Trainer(
        tiny_config(
            tiny_model_dir, tmp_path, *COMMON, "train.run_name=r", "train.save_every=1",
            "train.max_steps=1", "eval.before_after=false",
        )
    )  # fmt: skip
    first.fit()
    cfg = tiny_config(
        tiny_model_dir, tmp_path, *COMMON, "train.run_name=r", "train.max_steps=2",
        f"train.resume={tmp_path / 'r'}", "eval.before_after=false",
    )  # fmt: skip
    resumed = _with_copy_engine(cfg)  # built from the base weights, like a fresh vLLM engine
    resumed.fit()
    step2 = _rows(tmp_path / "r")[-1]
    assert step2["step"] == 2 and resumed.run.engine.loads >= 1
    # float32 engine and trainer on the same weights agree to rounding; the base weights are
    # one lr-1e-2 Adam step away (nats, not 1e-5)
    assert step2["logprob_diff_max"] < 1e-4, step2["logprob_diff_max"]


def test_eval_at_an_unsynced_step_measures_the_trainers_weights(tiny_model_dir, tmp_path):
    cfg = tiny_config(
        tiny_model_dir, tmp_path, *COMMON, "train.run_name=e", "train.max_steps=2",
        "rollout.sync_every=3", "eval.every=2", "eval.before_after=false",
    )  # fmt: skip
    trainer = _with_copy_engine(cfg)
    base = copy.deepcopy(trainer.model)
    trainer.fit()
    engine = trainer.run.engine
    assert engine.loads == 1  # no step reached sync_every=3: only the eval synced
    in_training = json.loads((tmp_path / "e" / "eval" / "step_000002.json").read_text())

    def records(model) -> dict:
        sets = build_eval_sets(cfg, heldout_rows=lambda: trainer.run.eval_rows, train_rows=list)
        rewards = RewardRunner(reward_specs(cfg))
        try:
            out = evaluate_sets(
                HFEngine(model, trainer.tokenizer),
                trainer.tokenizer,
                sets,
                rewards,
                template=cfg.data.template,
                system_prompt=cfg.data.system_prompt,
                max_new_tokens=cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens,
                seed=cfg.eval.seed,
            )
        finally:
            rewards.close()
        return json.loads(json.dumps(out.records))

    assert in_training["records"] == records(trainer.model)
    assert in_training["records"] != records(base)  # the base weights answer differently


@pytest.mark.parametrize("every", [1, 2])
def test_generation_syncs_every_n_updates(tiny_model_dir, tmp_path, every):
    cfg = tiny_config(
        tiny_model_dir, tmp_path, *COMMON, f"rollout.sync_every={every}", "train.max_steps=4",
        "eval.before_after=false",
    )  # fmt: skip
    trainer = _with_copy_engine(cfg)
    summary = trainer.fit()
    rows = _rows(tmp_path / summary["run_dir"])
    assert trainer.run.engine.loads == 4 // every
    assert [r["policy_version"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        lag = (r["step"] - 1) % every  # updates the engine was behind when it sampled step r
        assert (r["logprob_diff_max"] < 1e-4) == (lag == 0), (r["step"], r["logprob_diff_max"])


@pytest.mark.parametrize("engine", ["rollout.engine=vllm", "rollout.mode=server"])
def test_sync_every_above_one_is_refused_where_a_checkpoint_cannot_restore_the_engine(engine):
    """A vLLM engine (in this process or a server) that lags the trainer by up to
    ``rollout.sync_every - 1`` versions samples from weights no checkpoint holds: a resumed run
    (``--resume``, a stop signal's requeue) would push the restored, newer weights and sample
    from them, unlike the uninterrupted run. So the combination is refused, naming the knobs;
    the transformers engine samples from the trainer's own weights and is never behind."""
    from rlvr.config import ConfigError, load_config
    from rlvr.training.preflight.checks import check_config

    with pytest.raises(ConfigError, match=r"rollout\.sync_every=2 .*checkpoint"):
        check_config(load_config(None, [engine, "rollout.sync_every=2"]))
    check_config(load_config(None, [engine, "rollout.sync_every=1"]))
    check_config(load_config(None, ["rollout.engine=hf", "rollout.sync_every=2"]))
