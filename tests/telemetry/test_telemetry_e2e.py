"""Issue 7 end to end: planted faults stop tiny runs with the right named cause, the LR
pre-flight passes and fails as computed by hand, and `rlvr report` draws real runs."""

from __future__ import annotations

import html
import json
import math
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from matplotlib import image as mpimg

from rlvr.cli.main import main
from rlvr.telemetry.samples import list_sample_steps, read_samples

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def tiny(model_dir: Path, out: Path, name: str, *extra: str) -> list[str]:
    return [
        f"model.name_or_path={model_dir}",
        f"train.output_dir={out}",
        f"train.run_name={name}",
        "data.template=none",
        "rollout.max_new_tokens=8",
        "logging.progress=false",
        "train.threads=1",
        "algo.group_size=4",
        "algo.prompts_per_step=2",
        "eval.max_problems=4",
        *extra,
    ]


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_reward_stuck_at_zero_stops_the_run_with_exit_code_3(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    args = tiny(
        tiny_model_dir,
        tmp_path,
        "stuck",
        "reward.specs=[{name: 'toy_rewards:always_zero'}]",
        "health.warmup_steps=1",
        "health.window=2",
        "train.max_steps=6",
        "eval.before_after=false",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "rlvr", "train", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 3, proc.stderr
    run = tmp_path / "stuck"
    health = json.loads((run / "health.json").read_text())
    stop = health["stopped_by"]
    # warm-up 1: step 1 is the first checked step; reward_mean is 0 on steps 1 and 2, so the
    # window of 2 fills at step 2. grad_norm_zero also fires there (zero advantages), but
    # reward_stuck is checked first and names the cause.
    assert health["status"] == "stopped"
    assert (stop["rule"], stop["action"], stop["step"]) == ("reward_stuck", "stop", 2)
    assert stop["values"] == {"reward_mean": 0.0, "stuck_at": 0.0, "steps": 2}
    assert stop["advice"].startswith("reward_mean has sat at its minimum (0.0) for 2 steps")
    assert [m["step"] for m in read_metrics(run)] == [1, 2]  # nothing ran after the stop
    status = json.loads((run / "status.json").read_text())
    assert (status["state"], status["rule"]) == ("stopped_by_health", "reward_stuck")
    assert not (run / "final").exists()
    assert "stopped by the health gate: rule 'reward_stuck' at step 2" in proc.stderr
    # the work up to the stop is kept: a complete checkpoint of step 2, named in the status
    assert (run / "checkpoints" / "step_000002" / "COMPLETE").exists()
    assert status["checkpoint"].startswith("checkpoint of step 2: ")
    assert "kept: checkpoint of step 2" in proc.stderr


@pytest.fixture(scope="module")
def exploding_run(tiny_model_dir: Path, tmp_path_factory) -> tuple[int, Path]:
    """lr = 1e3: the first update wrecks the weights. reward_stuck is off so that only the
    gradient rules can name the cause; grad_norm_high stops instead of warning."""
    out = tmp_path_factory.mktemp("lr")
    code = main(
        [
            "train",
            *tiny(
                tiny_model_dir,
                out,
                "lr1e3",
                "reward.specs=[{name: 'toy_rewards:digit_fraction'}]",
                "train.lr=1e3",
                "train.max_steps=8",
                "health.warmup_steps=0",
                "health.reward_stuck.enabled=false",
                "health.grad_norm_high.action=stop",
                "eval.before_after=false",
            ),
        ]
    )
    return code, out / "lr1e3"


def test_learning_rate_1e3_stops_with_a_gradient_cause(exploding_run: tuple[int, Path]) -> None:
    code, run = exploding_run
    assert code == 3
    stop = json.loads((run / "health.json").read_text())["stopped_by"]
    # Which gradient symptom comes first depends on the arithmetic: NaNs, a huge norm, or (eager
    # attention) weights blown up so far that the softmax saturates and every gradient underflows
    # to exactly zero although the rewards still vary.
    assert stop["rule"] in ("nonfinite", "grad_norm_high", "grad_norm_zero")
    metrics = {m["step"]: m for m in read_metrics(run)}
    assert max(metrics) == stop["step"] < 8  # stopped early, at the step that fired
    if stop["rule"] == "nonfinite":
        # max_consecutive = 2: the third non-finite step in a row fires
        assert stop["values"] == {"steps": 3, "max_consecutive": 2}
        for step in range(stop["step"] - 2, stop["step"] + 1):
            m = metrics[step]
            assert m["nonfinite_skipped"] == 1.0 or not math.isfinite(m["grad_norm"])
    elif stop["rule"] == "grad_norm_zero":
        assert metrics[1]["grad_norm"] > 0  # the first update (at lr 1e3) did happen
        last = metrics[stop["step"]]
        assert last["grad_norm"] == 0.0 and last["adv_std"] > 0  # a signal, but no gradient
        assert "learning rate" in stop["advice"]
    else:
        assert metrics[stop["step"]]["grad_norm"] > 100.0


def test_preflight_fails_when_warmup_is_longer_than_the_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(
        ["preflight", "train.schedule=cosine", "train.warmup_steps=40", "train.max_steps=20"]
    )
    assert code == 2
    out = capsys.readouterr().out
    assert "config problem: train.warmup_steps=40 >= train.max_steps=20" in out


def test_preflight_fails_when_the_lr_is_still_low_at_step_20(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(
        [
            "preflight",
            "train.schedule=cosine",
            "train.warmup_steps=80",
            "train.max_steps=100",
            "train.lr=1e-5",
        ]
    )
    assert code == 2
    out = capsys.readouterr().out
    # warm-up gives (s + 1) / 80 of peak at step s: 21 / 80 = 26.25% at step 20 (< 30%);
    # the longest warm-up that passes is floor(21 / 0.3) = 70
    reached = re.search(r"reached only (\S+) = 26% of peak 1e-05 \(needs 30%\)", out)
    assert reached and float(reached.group(1)) == pytest.approx(1e-5 * 21 / 80, rel=5e-3)
    assert "Use warmup_steps <= 70." in out


def test_train_runs_the_preflight_before_loading_a_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "train",
            f"model.name_or_path={tmp_path}/no-model-here",
            f"train.output_dir={tmp_path}/runs",
            "train.schedule=cosine",
            "train.warmup_steps=80",
            "train.max_steps=100",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "learning-rate pre-flight failed" in err and "no-model-here" not in err
    assert not (tmp_path / "runs").exists()


def test_preflight_passes_and_prints_the_schedule_the_run_uses(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(
        [
            "preflight",
            "train.schedule=cosine",
            "train.warmup_steps=10",
            "train.max_steps=100",
            "train.lr=1e-5",
            "train.min_lr_ratio=0.1",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    # 100 steps x 4 prompts / 2000 train rows = 0.20 epochs; 4 prompts x 8 samples = 32
    assert "train rows: 2000; prompts/step: 4; group size: 8; sequences/step: 32" in out
    assert "steps: 100 (= 0.20 epochs over the train rows)" in out

    def hand_lr(s: int) -> float:
        if s < 10:  # linear warm-up: (s + 1) / W
            return 1e-5 * (s + 1) / 10
        p = min(1.0, (s - 10) / 90)  # cosine from the peak down to 0.1 x peak at step 100
        return 1e-5 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))

    rows = re.findall(r"^\s*(\d+)\s+(\d\.\d{3}e[-+]\d+)\s+[\d.]+%", out, flags=re.M)
    # first step, end of warm-up, the checked step 20, the last step (99)
    assert {0, 9, 20, 99} <= {int(step) for step, _ in rows}
    for step, lr in rows:
        assert float(lr) == pytest.approx(hand_lr(int(step)), rel=1e-3)
    # step 0: 1/10 of peak; step 9: the peak; step 99: p = 89/90, 0.1 + 0.45 (1 + cos(89 pi/90))
    # = 0.10027 of peak
    assert dict(rows)["0"] == "1.000e-06" and dict(rows)["9"] == "1.000e-05"
    assert dict(rows)["99"] == "1.003e-06"
    # step 20: p = 10/90, cos(20 degrees) = 0.93969, 0.1 + 0.45 x 1.93969 = 0.97286 of peak
    assert "20   9.729e-06    97.3%  <- check" in out


class ImageSources(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.sources: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            self.sources.extend(v for k, v in attrs if k == "src" and v)


def test_report_draws_real_runs_with_valid_images(
    tiny_model_dir: Path,
    tmp_path: Path,
    exploding_run: tuple[int, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    healthy_args = tiny(
        tiny_model_dir,
        tmp_path,
        "healthy",
        "reward.specs=[{name: 'toy_rewards:count_sevens'}]",
        "train.max_steps=2",
        "eval.every=1",
        "logging.samples_every=1",
    )
    assert main(["train", *healthy_args]) == 0
    healthy = tmp_path / "healthy"
    _, exploded = exploding_run
    out = tmp_path / "report"
    assert main(["report", str(healthy), str(exploded), "--out", str(out)]) == 0
    capsys.readouterr()

    page = (out / "report.html").read_text()
    parser = ImageSources()
    parser.feed(page)
    sources = parser.sources
    assert {"plots/reward.png", "plots/eval.png", "plots/grad_norm.png"} <= set(sources)
    for src in sources:
        path = out / src
        assert path.read_bytes()[:8] == PNG_MAGIC, src
        pixels = mpimg.imread(path)
        assert pixels.ndim == 3 and pixels.shape[0] > 50 and pixels.shape[1] > 50, src
    # every PNG written is on the page and every image on the page was written
    assert sorted(f"plots/{p.name}" for p in (out / "plots").glob("*.png")) == sorted(sources)

    stop_rule = json.loads((exploded / "health.json").read_text())["stopped_by"]["rule"]
    assert f"stopped by {stop_rule}" in page
    assert "train.lr" in page  # the config difference between the two runs
    first = read_samples(healthy, list_sample_steps(healthy)[0])[0]
    assert html.escape(first["response"], quote=True) in page


@pytest.mark.parametrize(("template", "fires"), [("none", False), ("qwen_math", True)])
def test_has_boxed_is_checked_only_where_the_prompts_ask_for_a_box(
    tiny_model_dir: Path, tmp_path: Path, template: str, fires: bool
) -> None:
    """The demo's first warning: the arithmetic task ("What is 3 + 4?") never asks for a box, so
    a has_boxed of 0 says nothing; under qwen_math ("put your final answer within \\boxed{}")
    the same 0 is the format lost. The tiny random model never writes a box, so has_boxed is 0
    at every step and the rule (made a stop to show in the exit code) fires at step 1 exactly
    where it applies."""
    args = tiny(
        tiny_model_dir,
        tmp_path,
        template,
        f"data.template={template}",
        "health.warmup_steps=0",
        "health.has_boxed.action=stop",
        "train.max_steps=2",
        "eval.before_after=false",
    )
    code = main(["train", *args])
    run = tmp_path / template
    assert [m["has_boxed"] for m in read_metrics(run)] == ([0.0] if fires else [0.0, 0.0])
    if fires:
        assert code == 3
        stop = json.loads((run / "health.json").read_text())["stopped_by"]
        assert (stop["rule"], stop["step"]) == ("has_boxed", 1)
    else:
        assert code == 0
        events = json.loads((run / "health.json").read_text())["events"]  # truncation warns
        assert "has_boxed" not in [e["rule"] for e in events]
