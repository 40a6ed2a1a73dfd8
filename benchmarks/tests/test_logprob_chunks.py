"""The log-prob chunks study's arithmetic, worked by hand, and TRL's loss path reproduced there
against the full log-softmax."""

from __future__ import annotations

import pytest
import torch

from benchmarks.studies.logprob_chunks import extrapolate, slope_mib_per_1k, trl_logps


def _row(tokens, added, peak, seconds, **kw):
    return {
        "cpu_seconds": 2 * seconds,
        "side": "full",
        "tokens": tokens,
        "update_added_mib": added,
        "peak_rss_mib": peak,
        "seconds": seconds,
        **kw,
    }


def test_slope_per_1k_tokens_and_linear_extrapolation():
    rows = [_row(128, 1600, 2300, 50), _row(512, 6208, 6908, 230)]
    # (6208 - 1600) / (512 - 128) = 12 MiB a token: 12,000 MiB per 1k tokens
    assert slope_mib_per_1k(rows) == pytest.approx(12000)
    est = extrapolate(rows, 2048)
    # 6208 + 12 x 1536 = 24,640; 6908 + 12 x 1536 = 25,340; 230 + 180/384 x 1536 = 950 s
    assert est["extrapolated"] and est["update_added_mib"] == pytest.approx(24640)
    assert est["peak_rss_mib"] == pytest.approx(25340)
    assert est["seconds"] == pytest.approx(950)
    # an extrapolated point never enters a slope; one measured point gives none
    assert slope_mib_per_1k([rows[0], est]) is None


def test_trl_path_gives_the_log_softmax_of_the_completion_tokens():
    class Tiny(torch.nn.Module):  # logits = one-hot of the input id, scaled: easy to predict
        def forward(self, input_ids, attention_mask, logits_to_keep):
            logits = torch.nn.functional.one_hot(input_ids, 5).float() * 2.0
            return type("Out", (), {"logits": logits[:, -logits_to_keep:]})

    ids = torch.tensor([[1, 2, 3, 4]])
    comp = ids[:, -2:]
    logps, ents = trl_logps(Tiny(), ids, torch.ones_like(ids), comp, 0.5)
    # position t predicts token t+1 from logits one-hot(ids[t]) x 2 / 0.5
    want = torch.log_softmax(torch.nn.functional.one_hot(ids[:, 1:3], 5).float() * 4.0, -1)
    assert torch.allclose(logps, want.gather(-1, comp[..., None])[..., 0])
    assert torch.allclose(ents, -(want.exp() * want).sum(-1))


def test_repeated_runs_become_their_medians():
    from benchmarks.studies.logprob_chunks import median_row

    runs = [
        _row(512, 100, 900, 30, forward_seconds=10),
        _row(512, 300, 700, 10, forward_seconds=30),
        _row(512, 200, 800, 20, forward_seconds=20),
    ]
    out = median_row(runs)
    # each figure's own median: added 200, peak 800, seconds 20, CPU seconds 2 x 20 = 40
    assert (out["update_added_mib"], out["peak_rss_mib"], out["seconds"]) == (200, 800, 20)
    assert out["cpu_seconds"] == 40 and out["forward_seconds"] == 20
    assert out["repeats"] == 3 and out["side"] == "full" and out["tokens"] == 512


def test_the_single_process_mode_compares_every_side_with_the_full_path(tmp_path):
    """The GPU call's mode, run on the CPU: the three paths on one model and batch give the
    same log-probs and LM-head gradient (the chunked path recomputes the head's logits a chunk
    at a time; TRL's gathers then takes a logsumexp per row), each row says against what, and
    the report has a row per (length, side) with the differences."""
    import json

    from benchmarks.studies.logprob_chunks import main

    main(
        ["--in-process", "--tokens", "16,24", "--rows", "2", "--chunk", "8", "--out", str(tmp_path)]
    )
    payload = json.loads(next(tmp_path.glob("*-logprob-chunks-cpu.json")).read_text())
    rows = payload["rows"]
    assert [(r["tokens"], r["side"]) for r in rows] == [
        (t, s) for t in (16, 24) for s in ("chunked", "full", "trl")
    ]
    for r in rows:
        assert r["compared_with"] == "full"
        assert r["logp_max_abs_diff"] < 1e-4, r
        assert r["head_grad_rel_diff"] < 1e-4, r
        if r["side"] == "full":
            assert r["logp_max_abs_diff"] == 0.0 and r["head_grad_rel_diff"] == 0.0
    # the Dr.GRPO surrogate at ratio 1, every token kept: sum(-adv_i x T) / (rows x T) = -mean(adv)
    from benchmarks.studies.logprob_chunks import make_batch

    for tokens in (16, 24):
        want = -float(make_batch(tokens, 2)[1].mean())
        for r in rows:
            if r["tokens"] == tokens:
                assert r["loss"] == pytest.approx(want, rel=1e-5), r
    md = next(tmp_path.glob("*-logprob-chunks-cpu.md")).read_text()
    assert md.count("\n| 24 | ") == 3 and "max logp diff" in md
