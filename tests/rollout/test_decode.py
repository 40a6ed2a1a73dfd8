"""The hf engine's own decoding loop (rollout/decode.py): its sampler draws from the right
distribution, its greedy replies are transformers' ``generate``'s, rows that finish leave the
batch, and the log-probs it records are the ones the trainer recomputes afterwards (positions and
masks stay right after rows leave). Float32 throughout, on a tiny model trained to say "xyz"."""

from __future__ import annotations

import pytest
import torch
from vllm_support import base_model, max_abs_diff, trained_copy, trainer_logprobs

from rlvr.model.shared_prompt import distinct_rows
from rlvr.rollout.base import SamplingParams
from rlvr.rollout.decode import decode, sample_next, truncate_scores
from rlvr.rollout.hf import HFEngine
from rlvr.training.tiny import build_char_tokenizer

PROBS = [0.5, 0.25, 0.125, 0.0, 0.125]
PROMPTS = ["x", "xyz", "a b c d", "xyzxyzxy", "q", "hello world", "xy", "zzzzzzzzzzzz"]


def _scores(probs: list[float]) -> torch.Tensor:
    return torch.tensor(probs).log().unsqueeze(0)  # log(0) = -inf: never sampled


def _probs(probs: list[float], rows: int) -> torch.Tensor:
    return torch.tensor(probs).unsqueeze(0).expand(rows, -1)


@pytest.mark.parametrize("block", [2, 3, 256])
def test_sample_next_inverts_the_cumulative_distribution(block):
    """Token i is drawn for uniforms in [cdf[i-1], cdf[i]): worked out by hand for 0.5, 0.25,
    0.125, 0 and 0.125 (the zero-probability token's interval is empty). Blocks of 2 and 3
    split the row so the block step and the step inside the block both matter."""
    u = torch.tensor([0.0, 0.49, 0.5, 0.74, 0.75, 0.874, 0.875, 0.9999])
    got = sample_next(_probs(PROBS, len(u)), u, block=block)
    assert got.tolist() == [0, 0, 1, 1, 2, 2, 4, 4]


def test_sample_next_frequencies_match_the_probabilities():
    torch.manual_seed(0)
    n = 200_000
    draws = sample_next(_probs(PROBS, n), torch.rand(n), block=2)
    freq = torch.bincount(draws, minlength=len(PROBS)).double() / n
    # one standard deviation of a frequency is at most sqrt(0.25 / n) = 0.0011
    assert (freq - torch.tensor(PROBS, dtype=torch.float64)).abs().max() < 0.005
    assert freq[3] == 0.0


def test_top_k_keeps_the_k_most_likely():
    kept = truncate_scores(_scores([0.125, 0.5, 0.125, 0.25]), 2, 1.0).isfinite()
    assert kept.tolist() == [[False, True, False, True]]


def test_top_p_keeps_the_tokens_that_first_reach_it():
    """0.5 + 0.25 reaches 0.7: the first two tokens stay, the rest go."""
    kept = truncate_scores(_scores([0.5, 0.25, 0.125, 0.125]), 0, 0.7).isfinite()
    assert kept.tolist() == [[True, True, False, False]]


@pytest.fixture(scope="module")
def model_tok():
    torch.manual_seed(0)
    tok = build_char_tokenizer()
    return trained_copy(base_model(tok), tok, steps=30), tok


def _left_padded(ids: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(i) for i in ids)
    x = torch.full((len(ids), width), pad)
    mask = torch.zeros_like(x)
    for r, i in enumerate(ids):
        x[r, width - len(i) :] = torch.tensor(i)
        mask[r, width - len(i) :] = 1
    return x, mask


def test_greedy_replies_and_logprobs_are_generates(model_tok):
    """Same prompts, same model: our loop's greedy tokens are transformers' generate's, and its
    log-probs are the log-softmax of generate's own logits at those tokens."""
    model, tok = model_tok
    ids = [tok(p, add_special_tokens=False).input_ids for p in PROMPTS]
    x, mask = _left_padded(ids, tok.pad_token_id)
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=8)
    with torch.no_grad():
        ours = decode(
            model, x, mask, params, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
        )
        ref = model.generate(
            input_ids=x,
            attention_mask=mask,
            max_new_tokens=8,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            return_dict_in_generate=True,
            output_logits=True,
        )
    new = ref.sequences[:, x.shape[1] :]
    logp = torch.stack([s.log_softmax(-1) for s in ref.logits], dim=1)  # [B, T, V]
    ended = {"stop": 0, "length": 0}
    for r, reply in enumerate(ours):
        n = len(reply.token_ids)
        assert reply.token_ids == new[r, :n].tolist()
        want = logp[r, torch.arange(n), new[r, :n]]
        torch.testing.assert_close(torch.tensor(reply.logprobs), want, atol=1e-5, rtol=0)
        ended[reply.finish_reason] += 1
        if reply.finish_reason == "stop":
            assert reply.token_ids[-1] == tok.eos_token_id
        else:
            assert n == 8
    assert ended["stop"] > 0 and ended["length"] > 0  # both endings occur


class CountRows(torch.nn.Module):
    """The model, recording how many rows each forward pass runs."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.config = model.config  # the cache is sized from it
        self.rows: list[int] = []

    def forward(self, **kw):
        self.rows.append(kw["input_ids"].shape[0])
        return self.model(**kw)


def test_finished_rows_leave_the_batch(model_tok):
    """A row that hit EOS is not run again: each decoding pass runs exactly the rows still
    writing (counted from the replies' own lengths)."""
    model, tok = model_tok
    ids = [tok(p, add_special_tokens=False).input_ids for p in PROMPTS]
    x, mask = _left_padded(ids, tok.pad_token_id)
    counting = CountRows(model)
    with torch.no_grad():
        replies = decode(
            counting,
            x,
            mask,
            SamplingParams(n=1, temperature=0.0, max_new_tokens=12),
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
    lengths = [len(r.token_ids) for r in replies]
    assert len(set(lengths)) > 1
    # pass 0 is the prefill; pass t feeds token t, so it runs the rows longer than t tokens
    want = [len(ids)] + [sum(n > t for n in lengths) for t in range(1, max(lengths))]
    assert counting.rows == want


def test_a_groups_prompt_is_prefilled_once(model_tok):
    """Four samples of each prompt in adjacent rows, as the engine lays a group out, and a
    fifth copy of the first prompt apart from its group: the prefill runs each distinct prompt
    once, and the sampled replies and their log-probs are the ones prefilling every row gives."""
    model, tok = model_tok
    ids = [tok(p, add_special_tokens=False).input_ids for p in PROMPTS[:3]]
    rows = [i for i in ids for _ in range(4)] + [ids[0]]
    params = SamplingParams(n=1, temperature=1.0, max_new_tokens=10, seed=7)
    runs = {}
    for share in (True, False):
        counting = CountRows(model)
        runs[share] = counting.rows, _decode_rows(counting, tok, rows, params, share_prefill=share)
    (shared_rows, shared), (all_rows, every) = runs[True], runs[False]
    assert shared_rows[0] == 3 and all_rows[0] == len(rows)
    assert shared_rows[1:] == all_rows[1:]  # the same rows decode after the prefill
    assert [r.token_ids for r in shared] == [r.token_ids for r in every]
    assert len({tuple(r.token_ids) for r in shared[:4]}) > 1  # a group's samples differ
    assert (
        max_abs_diff([torch.tensor(r.logprobs) for r in every], [r.logprobs for r in shared]) < 1e-5
    )


def test_distinct_rows_maps_every_row_to_its_first_copy():
    x = torch.tensor([[0, 5, 6], [0, 5, 6], [7, 8, 9], [0, 5, 6], [7, 8, 9]])
    mask = torch.tensor([[0, 1, 1]] * 2 + [[1, 1, 1], [1, 1, 1], [1, 1, 1]])
    firsts, copies = distinct_rows(x, mask)
    # row 3 has row 0's ids but not its mask: a different prompt
    assert sorted(firsts.tolist()) == [0, 2, 3]
    assert torch.equal(x[firsts][copies], x) and torch.equal(mask[firsts][copies], mask)
    assert distinct_rows(x[1:3], mask[1:3]) == (None, None)  # no two rows alike: nothing to share


def _passes_and_replies(model, tok, decoder: str):
    """Rows run by each forward pass of one greedy ``HFEngine.generate`` call, and its replies."""
    rows: list[int] = []
    hook = model.register_forward_pre_hook(
        lambda _m, _a, kw: rows.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        engine = HFEngine(model, tok, decoder=decoder)
        groups = engine.generate(
            [tok(p, add_special_tokens=False).input_ids for p in PROMPTS],
            SamplingParams(n=1, temperature=0.0, max_new_tokens=12),
        )
    finally:
        hook.remove()
    return rows, [c for g in groups for c in g]


def test_hf_decoder_picks_the_loop_or_generate(model_tok):
    """``rollout.hf_decoder``: 'loop' lets finished rows leave, 'generate' (transformers') runs
    every row to the end; greedy, both give the same replies and log-probs. The config value
    reaches the engines ``rlvr train`` builds for rollouts and for evaluation."""
    from rlvr.config import load_config
    from rlvr.eval.engine import hf_eval_engine
    from rlvr.rollout.builder import build_engine

    model, tok = model_tok
    loop_rows, loop = _passes_and_replies(model, tok, "loop")
    gen_rows, gen = _passes_and_replies(model, tok, "generate")
    assert len({len(c.token_ids) for c in loop}) > 1  # rows end at different steps
    assert set(gen_rows) == {len(PROMPTS)} and min(loop_rows) < len(PROMPTS)
    assert [c.token_ids for c in gen] == [c.token_ids for c in loop]
    assert max_abs_diff([torch.tensor(c.logprobs) for c in gen], [c.logprobs for c in loop]) < 1e-5
    for value in ("loop", "generate"):
        cfg = load_config(None, ["rollout.engine=hf", f"rollout.hf_decoder={value}"])
        assert build_engine(cfg, model, tok, autocast=False).decoder == value
        assert hf_eval_engine(model, tok, cfg, torch.float32).decoder == value
    with pytest.raises(ValueError, match="decoder='beam'"):
        HFEngine(model, tok, decoder="beam")


@pytest.mark.parametrize("stop", [(), ("y",)], ids=["eos", "stop_string"])
def test_sampled_logprobs_are_the_trainers(model_tok, stop):
    """Sampled replies (temperature 0.7, rows leaving as they finish): the recorded log-prob of
    every token equals the trainer's recomputation over prompt + reply, and one seed gives one
    set of replies."""
    model, tok = model_tok
    ids = [tok(p, add_special_tokens=False).input_ids for p in PROMPTS]
    engine = HFEngine(model, tok)
    params = SamplingParams(n=4, temperature=0.7, max_new_tokens=10, seed=3, stop=stop)
    groups = engine.generate(ids, params)
    comps = [c for g in groups for c in g]
    assert len({len(c.token_ids) for c in comps}) > 2  # rows left at different steps
    prompts = [ids[i] for i, g in enumerate(groups) for _ in g]
    trainer = trainer_logprobs(model, prompts, [c.token_ids for c in comps], tok.pad_token_id, 0.7)
    assert max_abs_diff(trainer, [c.logprobs for c in comps]) < 1e-4
    again = engine.generate(ids, params)
    assert [c.token_ids for g in again for c in g] == [c.token_ids for c in comps]
    if stop:
        stopped = [c for c in comps if c.finish_reason == "stop"]
        assert stopped and all(
            c.text.endswith("y") or c.token_ids[-1] == tok.eos_token_id for c in stopped
        )


# ----------------------------------------------------------------------------- synced (FSDP)

RANK_PROMPTS = [["x", "xyz"], ["a b c d", "hello world"]]  # rank 1's replies run longer


def _rank_decode(rank: int, init: str, model, tok, params, out) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        counting = CountRows(model)
        out[rank] = _sampled(counting, tok, RANK_PROMPTS[rank], params, synced=True)
        out[f"passes{rank}"] = len(counting.rows)
    finally:
        dist.destroy_process_group()


def _decode_rows(model, tok, rows: list[list[int]], params, **kw):
    """``decode`` of left-padded token-id rows, seeded with ``params.seed``."""
    x, mask = _left_padded(rows, tok.pad_token_id)
    torch.manual_seed(params.seed)
    with torch.no_grad():
        return decode(
            model,
            x,
            mask,
            params,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
            **kw,
        )


def _sampled(model, tok, prompts, params, *, synced=False):
    ids = [tok(p, add_special_tokens=False).input_ids for p in prompts]
    return [r.token_ids for r in _decode_rows(model, tok, ids, params, synced=synced)]


def test_synced_processes_run_together_and_sample_what_one_process_does(model_tok, tmp_path):
    """Two real processes (gloo), synced as under FSDP: both run the same number of forward
    passes, as many as the longer rank needs, and each samples exactly the replies it samples
    alone with rows leaving the batch (a row's random draws do not depend on the others')."""
    import torch.multiprocessing as mp

    model, tok = model_tok
    params = SamplingParams(n=1, temperature=1.0, max_new_tokens=12, seed=5)
    alone = [_sampled(model, tok, p, params) for p in RANK_PROMPTS]
    with mp.Manager() as manager:
        out = manager.dict()
        init = f"file://{tmp_path / 'store'}"
        mp.spawn(_rank_decode, args=(init, model, tok, params, out), nprocs=2, join=True)
        got = dict(out)
    assert [got[0], got[1]] == alone
    longest = max(len(r) for rank in alone for r in rank)
    assert got["passes0"] == got["passes1"] == longest  # prefill + one pass per token after it
    assert max(len(r) for r in alone[0]) < longest  # rank 0 waited for rank 1
