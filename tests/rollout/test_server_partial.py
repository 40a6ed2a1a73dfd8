"""rollout.partial=true against a real vLLM server (`rlvr rollout-server`, tiny float32 model):
a weight push lands while a generation runs; vLLM freezes the request (``/pause?mode=keep``),
the push preempts it (its KV cache of the old weights dropped), and after ``/resume`` it goes on
from its prompt and tokens so far on the new weights.

- one generation spanning a push: its tokens carry version 0 then 1 (vLLM's own spans), the
  engine log-probs of the tokens before the push are those of the old weights and of the tokens
  after it those of the new weights, each within the float32 tolerance of the vLLM tests;
- a 3-step training run with rollout.max_staleness=1 rollout.partial=true logs per-token lags
  within 0..1 and finishes.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from test_server_e2e import RUN, _config, _lines
from vllm_support import (
    LOGPROB_TOL,
    STALE_MIN,
    TINY,
    rollout_server,
    trained_copy,
    trainer_logprobs,
)

from rlvr.rollout.base import SamplingParams
from rlvr.rollout.server_auth import token_from_env
from rlvr.training.trainer import Trainer

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from rlvr.training.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("partial") / "model", **TINY)


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    """`rlvr rollout-server` for the tiny model with room for 64-token replies."""
    log = tmp_path_factory.mktemp("partial_log") / "server.log"
    with rollout_server(model_dir, [*RUN, "rollout.max_new_tokens=64"], log) as url:
        yield url


def _models(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    old = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return tok, old, trained_copy(old, tok, steps=30)


def test_a_generation_spanning_a_push_carries_both_versions_and_the_new_weights_logprobs(
    model_dir, server
):
    from rlvr.rollout.server import ServerEngine

    tok, old, new = _models(model_dir)
    engine = ServerEngine(
        server, dtype=torch.float32, tied=True, partial=True, token=token_from_env()
    )
    prompt = tok("abc", add_special_tokens=False).input_ids
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=64, seed=3)
    spanning = []
    try:
        # The push must land after a reply's first token and before its last: the delay that
        # does so depends on the machine, so a few are tried, each from the old weights again.
        for delay in (0.05, 0.02, 0.1, 0.2, 0.01, 0.3):
            engine.load_weights(old.state_dict().items())
            engine.policy_version = 0
            with ThreadPoolExecutor(1) as pool:
                future = pool.submit(engine.generate, [prompt], params)
                time.sleep(delay)
                with engine.paused():
                    engine.load_weights(new.state_dict().items())
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
        assert 0 < cut < len(c.token_ids)
        assert c.token_versions == [0] * cut + [1] * (len(c.token_ids) - cut)
        assert c.policy_version == 0  # a completion's version is its oldest token's
        engine_lp = torch.tensor(c.logprobs)
        lp_old = trainer_logprobs(old, [prompt], [c.token_ids], tok.pad_token_id)[0]
        lp_new = trainer_logprobs(new, [prompt], [c.token_ids], tok.pad_token_id)[0]
        assert float((engine_lp[:cut] - lp_old[:cut]).abs().max()) < LOGPROB_TOL
        assert float((engine_lp[cut:] - lp_new[cut:]).abs().max()) < LOGPROB_TOL
        # the two weight sets really differ on these tokens (so the checks above can fail)
        assert float((lp_new[cut:] - lp_old[cut:]).abs().max()) > STALE_MIN


def test_a_partial_run_logs_token_lags_within_one_version(model_dir, server, tmp_path):
    extra = ("rollout.mode=server", f"rollout.server_url={server}", "rollout.max_staleness=1")
    extra += ("rollout.partial=true", "rollout.max_new_tokens=64", "train.save_every=1")
    trainer = Trainer(_config(model_dir, tmp_path / "partial", *extra))
    trainer.fit()
    lines = _lines(trainer.run.run_dir)
    assert [m["step"] for m in lines] == [1, 2, 3]
    assert lines[0]["token_lag_max"] == 0.0  # the first batch is generated on the spot
    for m in lines[1:]:
        assert 0.0 <= m["token_lag_mean"] <= m["token_lag_max"] <= 1.0
        assert m["token_lag_mean"] <= m["staleness_mean"] <= 1.0  # a reply's oldest token
    saved = json.loads(
        (trainer.run.run_dir / "checkpoints" / "step_000002" / "trainer_state.json").read_text()
    )
    (ahead,) = saved["extra"]["lookahead"]["batches"]  # the checkpoint holds the whole batch
    for grp in ahead["groups"]:
        for c in grp:
            versions = c["token_versions"] or [c["policy_version"]] * len(c["token_ids"])
            assert set(versions) <= {1, 2} and len(versions) == len(c["token_ids"])


def test_an_abort_ends_the_generation_in_flight_at_once(model_dir, server):
    """What a run that stops does with a batch ahead still generating (`Lookahead.close`): the
    server aborts it (``/abort_requests``) and the ``generate`` waiting on it raises at once
    instead of returning after the whole generation; the server then serves the next trainer."""
    from rlvr.rollout.server import ServerEngine

    tok, old, _ = _models(model_dir)
    engine = ServerEngine(
        server, dtype=torch.float32, tied=True, partial=True, token=token_from_env()
    )
    prompt = tok("abc", add_special_tokens=False).input_ids
    try:
        engine.load_weights(old.state_dict().items())
        engine.policy_version = 0
        # 512 replies of up to 64 tokens, 32 at a time (the server's max_num_seqs): seconds
        long = SamplingParams(n=16, temperature=1.0, max_new_tokens=64, seed=3)
        with ThreadPoolExecutor(1) as pool:
            t = time.monotonic()
            future = pool.submit(engine.generate, [prompt] * 32, long)
            time.sleep(1.0)
            engine.abort_generations()
            with pytest.raises(RuntimeError, match="abort"):
                future.result(timeout=60)
            assert time.monotonic() - t < 20
        short = SamplingParams(n=2, temperature=1.0, max_new_tokens=8, seed=3)
        assert len(engine.generate([prompt], short)[0]) == 2
    finally:
        engine.close()
