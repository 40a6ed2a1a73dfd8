"""LoRA under FSDP2 and PPO's critic with several processes: torchrun with 2 CPU ranks (gloo).

Same global batch, same seed, per-prompt sampling seeds: a 2-rank run and a 1-process run draw
the same replies, so they reach the same adapter / policy / critic weights up to float32
summation order. A 2-rank run is bitwise reproducible (fresh invocations, and a resume from a
sharded checkpoint), and its sharded checkpoint exports in one process.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from dist_support import (
    ONE,
    TORCHRUN,
    computed,
    max_diff,
    rewind_to,
    run,
    steps,
    train_args,
    weights,
)

from rlvr.checkpoint.full import TENSOR_STATE, latest_checkpoint
from rlvr.checkpoint.merge import merge_checkpoint
from rlvr.checkpoint.sharded import export_full_model, full_model_state, is_sharded
from rlvr.eval.loading import resolve_source

STEPS = 4
LORA = ["model.lora.enabled=true", "model.lora.rank=4", "train.save_every=2"]
# the critic starts at zero and its default lr (1e-5) would hardly move it in 4 steps
PPO = ["algo.objective=ppo", "algo.ppo.value_lr=1e-2", "train.save_every=2"]

# Tolerances against one process. Two ranks sum the same gradients in another order: float32
# round-off of a few ulps. AdamW divides each update by sqrt(v): an element whose gradient is
# near zero (LoRA's A matrices get none at the first step, while B is still 0) passes its
# round-off through at up to lr = 1e-2 times its relative error, so after 4 steps at lr 1e-2 the
# adapters agree to ~1e-5 (measured worst here: adapters 7.7e-6, PPO policy 2.5e-6, critic
# 3e-8, on weights of size 0.03-0.1), so the bound is 1e-4, 10x above what was seen. A real
# fault (a rank's gradient missing, gradients not averaged, per-rank statistics) moves elements
# by ~lr = 1e-2 per step, 100x above the bound, and shows in grad_norm (compared to 1e-4).
LORA_ATOL = 1e-4
PPO_ATOL = 1e-4


def _compare_to_one(one: Path, two: Path) -> None:
    s1, s2 = steps(one), steps(two)
    assert [m["step"] for m in s2] == list(range(1, STEPS + 1))
    for a, b in zip(s1, s2, strict=True):
        assert a["reward_mean"] == pytest.approx(b["reward_mean"], abs=1e-6)
        assert a["response_len_mean"] == b["response_len_mean"]
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)


def _critic(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The value head of a checkpoint: from dcp/ (sharded) or trainer_state.pt."""
    if is_sharded(checkpoint):
        return full_model_state(checkpoint, "objective")
    saved = torch.load(checkpoint / TENSOR_STATE, map_location="cpu", weights_only=True)
    return {f"value_head.{k}": v for k, v in saved["objective"].items()}


def test_lora_fsdp2_two_ranks_match_one_process_and_reproduce(tiny_model_dir, tmp_path):
    def args(name: str) -> list[str]:
        return train_args(tiny_model_dir, tmp_path, name, STEPS, "train.parallel=fsdp2", *LORA)

    run(ONE, args("one"), tmp_path)
    run(TORCHRUN, args("two"), tmp_path)
    run(TORCHRUN, args("again"), tmp_path)
    one, two, again = tmp_path / "one", tmp_path / "two", tmp_path / "again"

    # a fresh invocation reproduces every computed metric and the adapters bitwise (the LoRA
    # matrices are drawn from train.seed, the same on every rank and in every invocation)
    assert [computed(m) for m in steps(two)] == [computed(m) for m in steps(again)]
    a2, a_again = weights(two / "final"), weights(again / "final")
    assert all(torch.equal(a2[k], a_again[k]) for k in a2)

    # the adapters of 2 ranks are those of one process
    _compare_to_one(one, two)
    a1 = weights(one / "final")
    assert all(".lora_A." in k or ".lora_B." in k for k in a1)  # only the adapters are saved
    assert max_diff(a1, a2) < LORA_ATOL
    lora_b = max(float(v.abs().max()) for k, v in a1.items() if ".lora_B." in k)
    assert lora_b > 1e-3  # B starts at zero: the adapters did train

    # resume from the sharded checkpoint of step 2: bitwise the uninterrupted run
    resumed = rewind_to(again, tmp_path / "resumed", 2)
    run(TORCHRUN, ["--resume", str(resumed)], tmp_path)
    assert [computed(m) for m in steps(resumed)] == [computed(m) for m in steps(two)]
    a_res = weights(resumed / "final")
    assert all(torch.equal(a_res[k], a2[k]) for k in a2)

    # the sharded checkpoint holds the adapters only and exports, in one process, to a peft
    # folder that `rlvr eval` loads as an adapter
    ckpt = latest_checkpoint(two)
    assert ckpt.step == STEPS and is_sharded(ckpt.path)
    assert all(".lora_" in k for k in full_model_state(ckpt.path))
    source = resolve_source(str(ckpt.path))
    assert source.is_adapter and Path(source.model) == export_full_model(ckpt.path)
    exported = weights(Path(source.model))
    assert all(torch.equal(exported[k], a2[k]) for k in a2)
    # `rlvr merge` of the sharded checkpoint: the base with the run's final adapter folded in
    merged = weights(merge_checkpoint(ckpt.path, tmp_path / "merged"))
    want = weights(merge_checkpoint(two / "final", tmp_path / "merged_final"))
    assert merged.keys() == want.keys() and all(torch.equal(merged[k], want[k]) for k in want)
    base = weights(tiny_model_dir)
    assert max(float((merged[k] - base[k]).abs().max()) for k in merged if k in base) > 1e-3


@pytest.fixture(scope="module")
def ppo_one(tiny_model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ppo")
    run(ONE, train_args(tiny_model_dir, out, "one", STEPS, *PPO), out)
    return out / "one"


@pytest.mark.parametrize("parallel", ["fsdp2", "ddp"])
def test_ppo_two_ranks_match_one_process(ppo_one, tiny_model_dir, tmp_path, parallel):
    args = train_args(tiny_model_dir, tmp_path, "two", STEPS, f"train.parallel={parallel}", *PPO)
    run(TORCHRUN, args, tmp_path)
    two = tmp_path / "two"
    _compare_to_one(ppo_one, two)
    s1, s2 = steps(ppo_one), steps(two)
    for a, b in zip(s1, s2, strict=True):
        assert a["value_loss"] == pytest.approx(b["value_loss"], rel=1e-4)
    p1, p2 = weights(ppo_one / "final"), weights(two / "final")
    assert max_diff(p1, p2) < PPO_ATOL
    base = weights(tiny_model_dir)
    assert max(float((p1[k] - base[k]).abs().max()) for k in p1 if k in base) > 1e-3

    c1 = _critic(latest_checkpoint(ppo_one).path)
    c2 = _critic(latest_checkpoint(two).path)
    assert is_sharded(latest_checkpoint(two).path) == (parallel == "fsdp2")
    assert max_diff(c1, c2) < PPO_ATOL
    assert float(c1["value_head.weight"].abs().max()) > 1e-3  # it starts at zero: it trained

    if parallel != "fsdp2":
        return
    # resume from the sharded checkpoint of step 2 (critic and its optimizer state in dcp/):
    # bitwise the uninterrupted run
    resumed = rewind_to(two, tmp_path / "resumed", 2)
    run(TORCHRUN, ["--resume", str(resumed)], tmp_path)
    assert [computed(m) for m in steps(resumed)] == [computed(m) for m in steps(two)]
    p_res = weights(resumed / "final")
    assert all(torch.equal(p_res[k], p2[k]) for k in p2)
    c_res = _critic(latest_checkpoint(resumed).path)
    assert all(torch.equal(c_res[k], c2[k]) for k in c2)
