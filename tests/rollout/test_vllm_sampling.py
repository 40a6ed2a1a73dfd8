"""Sampling through vLLM: n samples per prompt, temperature-scaled log-probs, seeds, stop strings."""

from __future__ import annotations

import pytest
from vllm_support import LOGPROB_TOL, STALE_MIN, base_model, max_abs_diff, trained_copy
from vllm_support import trainer_logprobs as trainer_lp

from rlvr.rollout.base import SamplingParams
from rlvr.rollout.hf import HFEngine

pytestmark = pytest.mark.vllm

STOPS = tuple("0123456789aeiou")


@pytest.fixture
def random_engine(holder, tok):
    """The shared engine holding the untrained tiny model: high-entropy samples."""
    engine = holder.get()
    model = base_model(tok)
    engine.load_weights(model.state_dict().items())
    return engine, model


def _ids(tok, *texts: str) -> list[list[int]]:
    return [tok(t, add_special_tokens=False).input_ids for t in texts]


def test_n_distinct_samples_per_prompt(random_engine, tok):
    engine, _ = random_engine
    prompts = _ids(tok, "hello", "2+3=", "x")
    out = engine.generate(prompts, SamplingParams(n=6, temperature=1.0, max_new_tokens=12, seed=7))
    assert [len(g) for g in out] == [6, 6, 6]
    for i, group in enumerate(out):
        assert {c.prompt_index for c in group} == {i}
        assert len({tuple(c.token_ids) for c in group}) == 6
        for c in group:
            assert len(c.logprobs) == len(c.token_ids)
            assert all(lp <= 0.0 for lp in c.logprobs)
            assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
            if c.finish_reason == "length":
                assert len(c.token_ids) == 12
            else:  # no stop strings here: only the EOS token can stop a sample
                assert c.token_ids[-1] == tok.eos_token_id


def test_sampled_logprobs_are_temperature_scaled(random_engine, tok):
    engine, model = random_engine
    prompts = _ids(tok, "hello", "2+3=")
    out = engine.generate(prompts, SamplingParams(n=4, temperature=0.7, max_new_tokens=12, seed=3))
    flat = [c for g in out for c in g]
    rows = [p for p in prompts for _ in range(4)]
    comps = [c.token_ids for c in flat]
    engine_lp = [c.logprobs for c in flat]
    scaled = trainer_lp(model, rows, comps, tok.pad_token_id, temperature=0.7)
    assert max_abs_diff(scaled, engine_lp) < LOGPROB_TOL
    # ...and not the unscaled distribution's: T matters by far more than the tolerance
    unscaled = trainer_lp(model, rows, comps, tok.pad_token_id, temperature=1.0)
    assert max_abs_diff(unscaled, engine_lp) > STALE_MIN


def test_seed_fixes_the_samples(random_engine, tok):
    engine, _ = random_engine
    prompts = _ids(tok, "hello")

    def draw(seed: int) -> list[list[int]]:
        params = SamplingParams(n=4, temperature=1.0, max_new_tokens=10, seed=seed)
        return [c.token_ids for c in engine.generate(prompts, params)[0]]

    assert draw(11) == draw(11)
    assert draw(11) != draw(12)


def test_stop_strings_end_sampled_text(random_engine, tok):
    """A sample ends right after its first stop string (kept in the text), or at the length cap."""
    engine, _ = random_engine
    params = SamplingParams(n=6, temperature=1.0, max_new_tokens=12, stop=STOPS, seed=5)
    out = engine.generate(_ids(tok, "hello", "Q:", "#"), params)
    stopped_by_string = 0
    for c in (c for g in out for c in g):
        if c.token_ids[-1] == tok.eos_token_id:
            continue
        # the text never contains a stop string before its last character
        assert not any(s in c.text[:-1] for s in STOPS)
        if c.finish_reason == "stop":
            assert c.text[-1] in STOPS
            stopped_by_string += 1
        else:
            assert len(c.token_ids) == 12 and c.text[-1] not in STOPS
    # 15 of ~100 characters stop: P(a 12-token sample never hits one) ~ 0.85^12 = 0.14
    assert stopped_by_string >= 6


def test_greedy_stop_string_matches_hf_engine(engine, tok):
    trained = trained_copy(base_model(tok), tok)
    engine.load_weights(trained.state_dict().items())
    prompts = _ids(tok, "x", "hello")
    hf = HFEngine(trained, tok)
    plain = engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=12))[0][0]
    assert (plain.text, plain.token_ids[-1]) == ("yz", tok.eos_token_id)  # "x" -> "yz" EOS
    for stop in (("z",), ("yz",), ("q", "z")):
        params = SamplingParams(temperature=0.0, max_new_tokens=12, stop=stop)
        ours = [g[0] for g in engine.generate(prompts, params)]
        ref = [g[0] for g in hf.generate(prompts, params)]
        assert (ours[0].text, ours[0].finish_reason) == ("yz", "stop")
        assert ours[0].token_ids == _ids(tok, "yz")[0]  # stopped before the EOS
        for a, b in zip(ours, ref, strict=True):
            assert (a.token_ids, a.text, a.finish_reason) == (b.token_ids, b.text, b.finish_reason)


def test_greedy_groups_are_n_equal_replies(engine, tok):
    # rollout.temperature=0 with algo.group_size > 1: vLLM itself refuses n > 1 when greedy
    trained = trained_copy(base_model(tok), tok)
    engine.load_weights(trained.state_dict().items())
    prompts = _ids(tok, "x", "hello", "ab")
    out = engine.generate(prompts, SamplingParams(n=3, temperature=0.0, max_new_tokens=12))
    one = engine.generate(prompts, SamplingParams(n=1, temperature=0.0, max_new_tokens=12))
    assert [len(g) for g in out] == [3, 3, 3]
    for i, (group, single) in enumerate(zip(out, one, strict=True)):
        assert [c.prompt_index for c in group] == [i, i, i]
        assert {(tuple(c.token_ids), tuple(c.logprobs)) for c in group} == {
            (tuple(single[0].token_ids), tuple(single[0].logprobs))
        }
    assert out[0][0].text == "yz"  # the trained copy's greedy reply to "x"


def test_bad_prompts_fail_clearly(engine, tok):
    greedy = SamplingParams(temperature=0.0, max_new_tokens=16)
    with pytest.raises(ValueError, match=r"prompt_ids\[1\] is empty"):
        engine.generate([[5], []], greedy)
    # 40 prompt tokens + 16 new > max_model_len = 32 + 16 = 48 (data.max_prompt_tokens + max_new)
    with pytest.raises(ValueError, match="max_model_len=48"):
        engine.generate([[5] * 40], greedy)


def test_a_prompts_samples_share_its_prefill(random_engine, tok):
    """On the CPU backend rlvr holds the KV cache in 32-token blocks (``CPU_KV_BLOCK``): vLLM's
    prefix cache reuses whole blocks before a prompt's last token, so every request after the
    first of one prompt takes 32 * floor((L - 1) / 32) of its L tokens from the cache. With
    vLLM's default 128-token blocks these prompts (20-40 tokens) were prefilled every time."""
    from rlvr.rollout.vllm_setup import CPU_KV_BLOCK

    engine, _ = random_engine  # load_weights has just cleared the prefix cache
    if not engine.on_cpu:
        pytest.skip("the block size is set on the CPU backend only")
    assert CPU_KV_BLOCK == 32
    # distinct first characters: no prompt can reuse another's blocks
    prompts = _ids(tok, "a" * 36, "b" * 33, "c" * 31)
    assert [len(p) for p in prompts] == [36, 33, 31]
    # greedy: one request per sample, so each request reports its own cache hits
    engine.generate(prompts, SamplingParams(n=3, temperature=0.0, max_new_tokens=4))
    assert engine.last_cached_prompt_tokens == [0, 32, 32, 0, 32, 32, 0, 0, 0]
    # sampling, what training runs: one request with n samples, which vLLM runs as n requests
    # in one batch and reports by its last sample's hits (new prompts: nothing cached before)
    fresh = _ids(tok, "d" * 40, "e" * 20)
    engine.generate(fresh, SamplingParams(n=4, temperature=1.0, max_new_tokens=4, seed=1))
    assert engine.last_cached_prompt_tokens == [32, 0]
