"""Adapter-only LoRA sync (rollout.lora_sync=adapter, `rlvr.rollout.adapter_sync`) with vLLM in
the trainer's process: the engine serves the base model and reloads the adapter at each sync.

- after a sync of a trained adapter the engine samples what the merged engine samples with the
  same seed, and its log-probs equal the merged engine's and the trainer's within the float32
  tolerance of the vLLM tests (while the base model's are nats away); the sync moved exactly the
  adapter's tensors;
- `rlvr train` with model.lora.enabled and vLLM uses the adapter sync by default (lora_sync=auto)
  and logs engine log-probs within the tolerance of the trainer's at every step.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from vllm_support import (
    LOGPROB_TOL,
    STALE_MIN,
    base_model,
    engine_config,
    max_abs_diff,
    trained_copy,
    trainer_logprobs,
)

from rlvr.config import load_config
from rlvr.rollout.base import SamplingParams

pytestmark = pytest.mark.vllm

PROMPTS = ["12+3=", "abc", "7*7=", "hello"]


def _sample(engine, ids):
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=16, seed=5)
    groups = engine.generate(ids, params)
    prompts = [ids[c.prompt_index] for g in groups for c in g]
    return (
        prompts,
        [c.token_ids for g in groups for c in g],
        [c.logprobs for g in groups for c in g],
    )


def test_adapter_sync_samples_and_scores_like_the_merged_engine_and_the_trainer(holder, tok):
    from rlvr.rollout.vllm import VLLMEngine

    trained = trained_copy(holder.model, tok)  # the peft model with its adapter trained
    ids = [tok(p, add_special_tokens=False).input_ids for p in PROMPTS]
    merged = holder.get()  # the session engine: rollout.lora_sync=merged
    merged.load_weights(trained.state_dict().items())
    full_bytes = merged.last_sync_stats.bytes
    m_prompts, m_comps, m_lps = _sample(merged, ids)
    merged.close()  # one engine per process: the session's comes back on the next get()

    cfg = load_config(None, [*_overrides(engine_config()), "rollout.lora_sync=adapter"])
    engine = VLLMEngine.from_trainer(cfg, holder.model, tok)
    try:
        lora = {n: t for n, t in trained.state_dict().items() if "lora_" in n}
        engine.load_weights(trained.state_dict().items())
        stats = engine.last_sync_stats
        assert stats.tensors == len(lora) == 28  # A and B of 7 modules x 2 layers
        assert stats.bytes == sum(t.numel() * 4 for t in lora.values())  # float32, nothing else
        assert stats.bytes < 0.2 * full_bytes  # rank 4 on a hidden size of 128
        a_prompts, a_comps, a_lps = _sample(engine, ids)
    finally:
        engine.close()

    lp_trainer = trainer_logprobs(trained, a_prompts, a_comps, tok.pad_token_id)
    assert max_abs_diff(lp_trainer, a_lps) < LOGPROB_TOL
    assert max_abs_diff(trainer_logprobs(trained, m_prompts, m_comps, tok.pad_token_id), m_lps) < (
        LOGPROB_TOL
    )
    assert a_comps == m_comps  # the same seed, the same distributions: the same samples
    assert (
        max(
            abs(x - y) for a, m in zip(a_lps, m_lps, strict=True) for x, y in zip(a, m, strict=True)
        )
        < LOGPROB_TOL
    )
    # the adapter is really applied: the base model scores these samples nats away
    lp_base = trainer_logprobs(base_model(tok), a_prompts, a_comps, tok.pad_token_id)
    assert max_abs_diff(lp_base, a_lps) > STALE_MIN


def _overrides(cfg) -> list[str]:
    """``engine_config()``'s knobs again as overrides (it is built from a fixed list)."""
    r, d = cfg.rollout, cfg.data
    return [
        "model.autocast='off'",
        "rollout.engine=vllm",
        f"data.max_prompt_tokens={d.max_prompt_tokens}",
        f"rollout.max_new_tokens={r.max_new_tokens}",
        f"algo.prompts_per_step={cfg.algo.prompts_per_step}",
        f"algo.group_size={cfg.algo.group_size}",
        "train.seed=0",
    ]


def test_a_lora_run_with_vllm_syncs_the_adapter_only(vllm_model_dir, tmp_path):
    out = tmp_path / "runs"
    cmd = [sys.executable, "-m", "rlvr", "train", f"model.name_or_path={vllm_model_dir}"]
    cmd += [f"train.output_dir={out}", "train.run_name=lora", "train.max_steps=3"]
    cmd += ["train.lr=1e-2", "train.preflight_step=0", "data.template=none"]
    cmd += ["data.max_prompt_tokens=64", "rollout.engine=vllm", "rollout.max_new_tokens=8"]
    cmd += ["algo.group_size=4", "algo.prompts_per_step=2", "eval.before_after=false"]
    cmd += ["logging.progress=false", "reward.specs=[{name: 'toy_rewards:count_sevens'}]"]
    cmd += ["model.autocast=off", "model.lora.enabled=true", "model.lora.rank=4"]
    cmd += ["model.lora.alpha=16", "model.lora.target_modules=all-linear"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(x) for x in (out / "lora" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "logprob_diff_max" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    # rank 4 on all 7 linears of 2 layers (hidden 128, intermediate 128, one KV head of 64):
    # A is 4 x in, B is out x 4; q, o, gate, up, down are 128 -> 128, k and v 128 -> 64
    adapter_bytes = 2 * 4 * (5 * (128 + 128) + 2 * (128 + 64)) * 4  # float32
    for r in train:
        assert r["logprob_diff_max"] < LOGPROB_TOL  # after each step's adapter sync
        assert r["sync_bytes"] == adapter_bytes and r["sync_lora_merged"] == 0


# ---------------------------------------------------------------------- rollout.mode=server
SERVER_LORA = ["model.lora.enabled=true", "model.lora.rank=4", "model.lora.alpha=8"]
SERVER_LORA += ["model.lora.target_modules=all-linear"]


@pytest.fixture(scope="module")
def lora_server(vllm_model_dir, tmp_path_factory):
    """`rlvr rollout-server` for the base model with LoRA enabled (the run's config)."""
    from test_server_e2e import RUN
    from vllm_support import rollout_server

    log = tmp_path_factory.mktemp("lora_srv") / "server.log"
    args = [*RUN, *SERVER_LORA, "rollout.max_new_tokens=64"]
    with rollout_server(vllm_model_dir, args, log) as url:
        yield url


def _peft_from(model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm_support import LORA_TARGETS

    tok = AutoTokenizer.from_pretrained(model_dir)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS, lora_dropout=0.0)
    return tok, get_peft_model(base, cfg).eval()


def test_the_server_serves_the_adapter_and_a_push_mid_generation_moves_it(
    vllm_model_dir, lora_server
):
    """rollout.mode=server with adapter-only sync: after a sync the server's log-probs are the
    trainer's under the trained adapter, and (rollout.partial) a push of another adapter during a
    generation moves the replies in flight to it: tokens before the push score as the old
    adapter, after it as the new one."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from rlvr.rollout.server import ServerEngine

    tok, fresh = _peft_from(vllm_model_dir)  # B = 0: the base model
    trained = trained_copy(fresh, tok)
    cfg = load_config(
        None,
        [f"model.name_or_path={vllm_model_dir}", "model.autocast=off", "rollout.mode=server"]
        + [f"rollout.server_url={lora_server}", "rollout.partial=true"]
        + ["rollout.max_staleness=1", *SERVER_LORA],
    )
    engine = ServerEngine.from_trainer(cfg, fresh, tok)
    ids = [tok(p, add_special_tokens=False).input_ids for p in PROMPTS]
    try:
        engine.load_weights(trained.state_dict().items())
        lora = [t for n, t in trained.state_dict().items() if "lora_" in n]
        assert engine.last_sync_stats.bytes == sum(t.numel() * 4 for t in lora)
        prompts, comps, lps = _sample(engine, ids)
        assert max_abs_diff(trainer_logprobs(trained, prompts, comps, tok.pad_token_id), lps) < (
            LOGPROB_TOL
        )
        spanning, params = [], SamplingParams(n=4, temperature=1.0, max_new_tokens=64, seed=3)
        for delay in (0.05, 0.02, 0.1, 0.2, 0.01, 0.3):
            engine.load_weights(fresh.state_dict().items())
            engine.policy_version = 0
            with ThreadPoolExecutor(1) as pool:
                future = pool.submit(engine.generate, ids[:1], params)
                time.sleep(delay)
                with engine.paused():
                    engine.load_weights(trained.state_dict().items())
                    engine.policy_version = 1
                groups = future.result(timeout=120)
            spanning = [c for c in groups[0] if c.token_versions is not None]
            if spanning:
                break
    finally:
        engine.close()
    assert spanning, "no push landed inside a generation"
    for c in spanning:
        cut = c.token_versions.index(1)
        lp = torch.tensor(c.logprobs)
        old = trainer_logprobs(fresh, ids[:1], [c.token_ids], tok.pad_token_id)[0]
        new = trainer_logprobs(trained, ids[:1], [c.token_ids], tok.pad_token_id)[0]
        assert float((lp[:cut] - old[:cut]).abs().max()) < LOGPROB_TOL
        assert float((lp[cut:] - new[cut:]).abs().max()) < LOGPROB_TOL
        assert float((new[cut:] - old[cut:]).abs().max()) > STALE_MIN


def test_a_trainer_that_reconnects_to_the_server_registers_its_own_adapter(
    vllm_model_dir, lora_server
):
    """A restarted trainer (`rlvr train --resume` against the same `rlvr rollout-server`) comes
    with an adapter folder of its own, while vLLM still holds an adapter under rlvr's name (the
    previous trainer's, its folder removed): the new one replaces it, and the server samples
    from each trainer's adapter in turn."""
    from rlvr.rollout.server import ServerEngine

    tok, fresh = _peft_from(vllm_model_dir)
    trained = trained_copy(fresh, tok)
    cfg = load_config(
        None,
        [f"model.name_or_path={vllm_model_dir}", "model.autocast=off", "rollout.mode=server"]
        + [f"rollout.server_url={lora_server}", *SERVER_LORA],
    )
    ids = [tok(p, add_special_tokens=False).input_ids for p in PROMPTS]
    for model in (trained, fresh, trained):  # three trainers, one after the other
        engine = ServerEngine.from_trainer(cfg, model, tok)
        try:
            prompts, comps, lps = _sample(engine, ids)
        finally:
            engine.close()
        diff = max_abs_diff(trainer_logprobs(model, prompts, comps, tok.pad_token_id), lps)
        assert diff < LOGPROB_TOL


def test_an_adapter_trainer_gets_the_base_model_whatever_the_server_held(
    vllm_model_dir, lora_server
):
    """A standalone server outlives its trainers, and one of them may have pushed full weights
    (rollout.lora_sync=merged: base + B A merged in). A trainer with the adapter sync then
    connects: the server must serve the base model under its adapter (the trainer pushes the base
    weights when it connects), not the previous trainer's merged weights under it."""
    from rlvr.rollout.server import ServerEngine

    tok, fresh = _peft_from(vllm_model_dir)  # B = 0: computes exactly the base model
    trained = trained_copy(fresh, tok)
    run = [f"model.name_or_path={vllm_model_dir}", "model.autocast=off", "rollout.mode=server"]
    run += [f"rollout.server_url={lora_server}", *SERVER_LORA]
    ids = [tok(p, add_special_tokens=False).input_ids for p in PROMPTS]
    merged = ServerEngine.from_trainer(
        load_config(None, [*run, "rollout.lora_sync=merged"]), trained, tok
    )
    merged.close()  # it left base + B A in the server
    engine = ServerEngine.from_trainer(load_config(None, run), fresh, tok)
    try:
        prompts, comps, lps = _sample(engine, ids)
    finally:
        engine.close()
    pad = tok.pad_token_id
    assert max_abs_diff(trainer_logprobs(fresh, prompts, comps, pad), lps) < LOGPROB_TOL
    # what the server would have served on the merged weights: nats away
    assert max_abs_diff(trainer_logprobs(trained, prompts, comps, pad), lps) > STALE_MIN
