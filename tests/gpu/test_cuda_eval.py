"""Greedy evaluation on CUDA does not depend on the eval batch size (bf16, the GPU's default
eval dtype, and float32): each prompt's reply is the same alone or batched with others of other
lengths (left padding)."""

from __future__ import annotations

import json

import pytest
import torch
from tests.gpu.support import DEVICE

from rlvr.cli.main import main
from rlvr.training.tiny import build_char_tokenizer, build_tiny_model

pytestmark = pytest.mark.gpu

PROMPTS = ["1+1", "What is 12 * 15?", "7", "Compute 3 + 4 + 5 + 6 + 7 + 8 + 9 + 10 please", "99-9"]


@pytest.fixture(scope="module")
def sharp(tmp_path_factory):
    """A tiny model with weights scaled 20x (greedy replies differ by prompt; wide margins
    between the top two logits, so a rounding difference cannot flip an argmax by chance) and
    its probe file."""
    out = tmp_path_factory.mktemp("sharp")
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, seed=1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.mul_(20.0)
    model.save_pretrained(out / "model")
    tok.save_pretrained(out / "model")
    probe = out / "probe.jsonl"
    probe.write_text("".join(json.dumps({"prompt": p, "answer": "2"}) + "\n" for p in PROMPTS))
    return out / "model", probe


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_greedy_eval_is_batch_invariant_on_cuda(sharp, tmp_path, dtype, capsys):
    model, probe = sharp
    outs = []
    for b in (1, 2, 8):
        out = tmp_path / f"{b}.json"
        argv = [
            "eval",
            str(model),
            f"model.device={DEVICE}",
            f"eval.dtype={dtype}",
            f"eval.batch_size={b}",
            "data.template=none",
            "rollout.max_new_tokens=8",
            "reward.specs=[{name: 'toy_rewards:count_sevens'}]",
            "--data",
            str(probe),
            "--modes",
            "greedy",
            "--out",
            str(out),
        ]
        assert main(argv) == 0
        outs.append(json.loads(out.read_text()))
    capsys.readouterr()
    assert outs[0]["provenance"]["device"].startswith(DEVICE)
    assert outs[0]["provenance"]["dtype"] == dtype
    for other in outs[1:]:
        assert other["records"] == outs[0]["records"]
    greedy = outs[0]["records"]["probe"]["greedy"]
    assert len({r["responses"][0] for r in greedy}) > 1  # the comparison compares something
