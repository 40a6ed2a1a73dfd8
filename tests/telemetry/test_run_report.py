"""write_report on synthetic run directories written by the test itself."""

from __future__ import annotations

import json
import math
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from rlvr.telemetry import write_report
from rlvr.telemetry.plots import plot_grad_norm, plot_memory
from rlvr.telemetry.report_data import ABSENT, config_diff, flatten_config, load_run, rolling_mean

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class _Page(HTMLParser):
    """Collects image sources, tables (rows of cell texts) and all visible text."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.tables: list[list[list[str]]] = []
        self.text: list[str] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "img":
            self.images.append(dict(attrs)["src"])
        elif tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    return page


def _assert_images_valid(page: _Page, out_dir: Path) -> None:
    assert page.images, "the report references no image"
    for src in page.images:
        assert not src.startswith(("/", "http")), src  # relative to the report
        path = out_dir / src
        assert path.is_file(), src
        assert path.read_bytes()[:8] == PNG_SIGNATURE, src
        with Image.open(path) as image:
            image.verify()
        with Image.open(path) as image:
            assert image.format == "PNG" and image.width > 100 and image.height > 100


def _write_run(run_dir: Path, *, lr: float, steps: int = 12, with_extras: bool = True) -> None:
    """A run directory as the trainer leaves it, written with plain json / yaml."""
    run_dir.mkdir(parents=True)
    lines = []
    for s in range(steps):
        m: dict = {"step": s, "reward_mean": 0.05 * s, "correct": 0.04 * s}
        if with_extras:
            m.update(
                grad_norm=2.0 + s,
                kl="NaN" if s == 3 else 0.001 * s,  # non-finite values arrive as strings
                entropy_mean=1.5 - 0.05 * s,
                entropy_p10=0.5,
                entropy_p90=2.5,
                response_len_mean=40.0 - s,
                response_len_p10=20.0,
                response_len_p90=60.0,
                truncation_rate=0.1,
                clip_frac_low=0.01,
                clip_frac_high=0.03,
                time_rollout=3.0,
                time_reward=0.2,
                time_update=2.0,
                time_step=5.5,
            )
            if s % 5 == 0:
                m["eval/heldout/greedy_pass@1"] = 0.2 + 0.01 * s
        lines.append(json.dumps(m))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    config = {"model": {"name": "tiny"}, "train": {"lr": lr, "max_grad_norm": 1.0}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    (run_dir / "samples").mkdir()
    for s in (0, steps - 1):
        record = {"prompt": "What is 2+3?", "response": f"step {s}: <b>5</b>", "reward": 1.0}
        (run_dir / "samples" / f"step_{s:06d}.jsonl").write_text(json.dumps(record) + "\n")
    event = {
        "rule": "truncation",
        "action": "warn",
        "step": 7,
        "values": {"truncation_rate": 0.62},
        "advice": "Raise the generation limit.",
    }
    health = {"status": "warned", "stopped_by": None, "events": [event]}
    (run_dir / "health.json").write_text(json.dumps(health))


@pytest.fixture(scope="module")
def two_run_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, _Page]:
    root = tmp_path_factory.mktemp("runs")
    _write_run(root / "run_a", lr=1e-5)
    _write_run(root / "run_b", lr=2e-5)
    html_path = write_report([root / "run_a", root / "run_b"], root / "report")
    return html_path, _parse(html_path)


def test_report_images_exist_and_are_valid_pngs(two_run_report: tuple[Path, _Page]) -> None:
    html_path, page = two_run_report
    assert html_path.name == "report.html"
    _assert_images_valid(page, html_path.parent)
    stems = {Path(src).stem for src in page.images}
    # every metric family the runs logged has its plot ...
    assert stems == {
        "reward",
        "eval",
        "kl",
        "grad_norm",
        "entropy",
        "length",
        "clip_frac",
        "timings",
    }
    # ... and the absent ones (log-ratio tails, engine/trainer log-probs) are skipped


def test_report_config_diff_lists_only_differing_keys(two_run_report: tuple[Path, _Page]) -> None:
    _, page = two_run_report
    diff = next(t for t in page.tables if t and t[0] == ["key", "run_a", "run_b"])
    assert diff[1:] == [["train.lr", "1e-05", "2e-05"]]


def test_report_shows_health_events_and_samples(two_run_report: tuple[Path, _Page]) -> None:
    _, page = two_run_report
    health_rows = [row for t in page.tables for row in t if "truncation" in row]
    assert len(health_rows) == 2  # one per run
    assert health_rows[0] == [
        "7",
        "truncation",
        "warn",
        "truncation_rate=0.62",
        "Raise the generation limit.",
    ]
    text = "".join(page.text)
    # the model's "<b>" came through as text, not as markup
    assert "step 0: <b>5</b>" in text and "step 11: <b>5</b>" in text


def test_grad_norm_plot_draws_the_clip_threshold(tmp_path: Path) -> None:
    _write_run(tmp_path / "run", lr=1e-5, steps=4)
    fig = plot_grad_norm([load_run(tmp_path / "run", "run")])
    lines = fig.axes[0].get_lines()
    # the metric line: grad_norm = 2 + step for steps 0..3
    assert list(lines[0].get_ydata()) == [2.0, 3.0, 4.0, 5.0]
    # the threshold: a horizontal line at train.max_grad_norm = 1.0
    assert list(lines[1].get_ydata()) == [1.0, 1.0]


def test_memory_plot_overlays_runs_with_each_plan_as_a_line(tmp_path: Path) -> None:
    for name, plan in (("a", 1.5), ("b", 2.25)):
        lines = [{"step": s, "mem_rss_gib": s, "mem_rss_peak_gib": s + 0.25} for s in (1, 2, 3)]
        lines[0]["mem_plan_gib"] = plan  # the first line carries the plan
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    runs = [load_run(tmp_path / n, n) for n in ("a", "b")]
    ax = plot_memory(runs).axes[0]
    drawn = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
    # each run's peak and current RSS per step, and its plan as a horizontal line
    assert drawn["a: mem_rss_peak_gib"] == drawn["b: mem_rss_peak_gib"] == [1.25, 2.25, 3.25]
    assert drawn["a: mem_rss_gib"] == [1.0, 2.0, 3.0]
    assert drawn["a: memory plan 1.50 GiB"] == [1.5, 1.5]
    assert drawn["b: memory plan 2.25 GiB"] == [2.25, 2.25]
    html_path = write_report([tmp_path / "a", tmp_path / "b"], tmp_path / "out")
    assert "memory" in {Path(src).stem for src in _parse(html_path).images}


def test_one_step_run_and_missing_metrics_do_not_crash(tmp_path: Path) -> None:
    _write_run(tmp_path / "single", lr=1e-5, steps=1, with_extras=False)
    (tmp_path / "empty").mkdir()  # no metrics, config, samples or health at all
    html_path = write_report([tmp_path / "single", tmp_path / "empty"], tmp_path / "out")
    page = _parse(html_path)
    _assert_images_valid(page, html_path.parent)
    assert [Path(src).stem for src in page.images] == ["reward"]
    text = "".join(page.text)
    assert "empty: no metrics.jsonl lines" in text
    assert "no samples/ files" in text


def test_report_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one run"):
        write_report([], tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="nope"):
        write_report([tmp_path / "nope"], tmp_path / "out")


def test_rolling_mean_by_hand() -> None:
    # window 3: [1], [1,2], [1,2,3], [2,3,4], [3,4,5], [4,5,6] -> 1, 1.5, 2, 3, 4, 5
    values = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    assert rolling_mean(values, 3).tolist() == [1.0, 1.5, 2.0, 3.0, 4.0, 5.0]
    # NaN entries are left out of each mean: [1], [1, nan] -> 1, [nan, 3] -> 3
    assert rolling_mean(np.array([1.0, math.nan, 3.0]), 2).tolist() == [1.0, 1.0, 3.0]


def test_config_flatten_and_diff() -> None:
    a = flatten_config({"train": {"lr": 1e-5, "epochs": 1}, "tags": ["x"], "opt": {}})
    assert a == {"train.lr": 1e-5, "train.epochs": 1, "tags": ["x"], "opt": {}}
    b = flatten_config({"train": {"lr": 1e-5, "epochs": 2}, "tags": ["x"], "seed": 3})
    assert config_diff([a, b]) == [
        ("opt", [{}, ABSENT]),
        ("seed", [ABSENT, 3]),
        ("train.epochs", [1, 2]),
    ]
    assert config_diff([a]) == []


def _custom_reward_run(run_dir: Path) -> Path:
    """A 3-step run of a user's reward: evals at steps 0 and 3, a reward that raised on a
    quarter of the replies at step 2, no correct/has_boxed (the reward reports no info)."""
    run_dir.mkdir(parents=True)
    lines = [
        {
            "step": 0,
            "eval/heldout/greedy_pass@1": 0.25,
            "eval/heldout/greedy/truncated_frac": 0.75,
            "eval/heldout/greedy/mean_reply_tokens": 47.0,
        },
        {"step": 1, "reward_mean": 0.2, "reward_failure_rate": 0.0, "truncation_rate": 0.9},
        {"step": 2, "reward_mean": 0.3, "reward_failure_rate": 0.25, "truncation_rate": 0.8},
        {
            "step": 3,
            "reward_mean": 0.5,
            "reward_failure_rate": 0.0,
            "truncation_rate": 0.5,
            "eval/heldout/greedy_pass@1": 0.5,
            "eval/heldout/greedy/truncated_frac": 0.5,
            "eval/heldout/greedy/mean_reply_tokens": 40.0,
        },
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    config = {
        "reward": {"specs": [{"name": "my_reward:score", "weight": 1.0}]},
        "algo": {"beta": 0.0},
    }
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    return run_dir


def test_the_report_answers_did_it_work(tmp_path: Path) -> None:
    """The first table: held-out before -> after with the change, the training reward's first
    -> last steps (means of the first and last step here: 3 steps), the reward failures, the
    last truncation; a custom reward's run lists correct/has_boxed as expected absences, not
    as metrics that silently stopped."""
    run = _custom_reward_run(tmp_path / "mine")
    page = _parse(write_report([run], tmp_path / "out"))
    summary = page.tables[0]
    assert summary[0][1:4] == ["run state", "steps", "held-out: before training -> last evaluation"]
    row = dict(zip(summary[0], summary[1], strict=True))
    assert row["held-out: before training -> last evaluation"] == (
        "heldout/greedy_pass@1: 0.250 -> 0.500 (+0.250); "
        "heldout/greedy replies cut at the token limit: 75% -> 50%"
    )
    assert row["reward_mean: first -> last steps"] == "0.2 -> 0.5"  # k = min(3, 3 // 2) = 1
    assert row["reward failures"].startswith("8% of replies (at most 25%, step 2)")
    assert row["truncated (last step)"] == "50%"
    text = "".join(page.text)
    assert "Not logged, as expected for this run" in text
    assert (
        "correct, has_boxed, has_answer, high_reward_wrong_rate (the run's rewards are your own"
        in text
    )
    assert "kl (algo.beta=0" in text
    assert "should have logged and never did" in text  # other contract keys: this run lacks them
    surprise = text.split("should have logged and never did")[1].split("Not logged")[0]
    assert "correct" not in surprise and "has_boxed" not in surprise


def test_eval_accuracy_has_an_axis_of_its_own(tmp_path: Path) -> None:
    """greedy_pass@1 (0-1) used to share a y-axis with the reply length (40-50 tokens), a flat
    line under the legend; now each kind has its panel and accuracy a 0-1 axis."""
    from rlvr.telemetry.plots import plot_eval

    run = load_run(_custom_reward_run(tmp_path / "mine"), "mine")
    fig = plot_eval([run])
    labels = [[line.get_label() for line in ax.get_lines()] for ax in fig.axes]
    assert labels[0] == ["mine: heldout/greedy_pass@1"]
    assert labels[1] == ["mine: heldout/greedy/truncated_frac"]
    assert labels[2] == ["mine: heldout/greedy/mean_reply_tokens"]
    assert fig.axes[0].get_ylim() == pytest.approx((-0.02, 1.02))
    assert list(fig.axes[0].get_lines()[0].get_ydata()) == [0.25, 0.5]


def _status(run_dir: Path, **status) -> Path:
    (run_dir / "status.json").write_text(json.dumps({"time": 0.0, **status}))
    return run_dir


def _summary_row(run_dir: Path, out: Path) -> dict[str, str]:
    summary = _parse(write_report([run_dir], out)).tables[0]
    return dict(zip(summary[0], summary[1], strict=True))


@pytest.mark.parametrize(
    "status, said",
    [
        ({"state": "finished"}, "finished"),
        ({"state": "failed", "error": "RuntimeError: boom", "step": 2}, "failed after step 2"),
        ({"state": "preempted", "signal": "SIGTERM", "step": 2}, "preempted (SIGTERM)"),
        ({"state": "interrupted", "step": 2}, "interrupted after step 2"),
        ({"state": "stopped_by_health", "rule": "grad_spikes"}, "stopped by the health gate"),
    ],
)
def test_the_first_table_says_how_the_run_ended(tmp_path: Path, status: dict, said: str) -> None:
    run = _status(_custom_reward_run(tmp_path / "mine"), **status)
    row = _summary_row(run, tmp_path / "out")
    assert row["run state"].startswith(said), row
    if status["state"] == "failed":
        assert "RuntimeError: boom" in row["run state"]


def test_a_run_still_running_or_killed_is_not_reported_as_done(tmp_path: Path) -> None:
    """status.json still says running (the run goes on, or was killed with no word): the first
    table says so, counts the steps against train.max_steps, and says that no evaluation after
    training exists instead of showing the one before training as the last."""
    run = _custom_reward_run(tmp_path / "mine")
    lines = (run / "metrics.jsonl").read_text().splitlines()[:-1]  # killed during step 3
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["train"] = {"max_steps": 3}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    _status(run, state="running")
    row = _summary_row(run, tmp_path / "out")
    assert row["run state"].startswith("not finished"), row
    assert "killed" in row["run state"]
    assert row["steps"] == "2 of 3"
    assert "no evaluation after training" in row["held-out: before training -> last evaluation"]
    (run / "status.json").unlink()  # a run of an older rlvr, or a folder copied without it
    row = _summary_row(run, tmp_path / "out2")
    assert row["run state"] == "unknown (no status.json)"


def test_held_out_gradings_that_raised_are_on_the_first_page(tmp_path: Path) -> None:
    """A reward that raises on held-out rows counts them wrong: the score alone (0.250 ->
    0.500) read as the model's, with 'reward failures: none' when training never raised."""
    run = _custom_reward_run(tmp_path / "mine")
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for m in lines:
        m["reward_failure_rate"] = 0.0
        if "eval/heldout/greedy_pass@1" in m:
            m["eval/heldout/greedy/reward_failed_frac"] = 0.5
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    row = _summary_row(run, tmp_path / "out")
    assert "held-out heldout/greedy: 50% of gradings raised" in row["reward failures"], row


def test_the_held_out_change_is_shown_beside_its_cut_replies(tmp_path: Path) -> None:
    """A held-out score over replies cut at the token limit measures the limit as much as the
    model: the first table put 0.250 -> 0.500 alone, the cut share only in a later table."""
    row = _summary_row(_custom_reward_run(tmp_path / "mine"), tmp_path / "out")
    cell = row["held-out: before training -> last evaluation"]
    assert cell.startswith("heldout/greedy_pass@1: 0.250 -> 0.500 (+0.250)")
    assert "heldout/greedy replies cut at the token limit: 75% -> 50%" in cell


def test_rlvr_report_prints_the_first_table(tmp_path: Path, capsys) -> None:
    """On a machine reached over ssh the HTML is a download away: `rlvr report` printed only
    its path. It prints the "Did it work?" table too, one block per run."""
    from rlvr.cli.main import main

    run = _status(_custom_reward_run(tmp_path / "mine"), state="finished")
    assert main(["report", str(run), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Did it work?\nmine: finished, 3 steps\n"), out
    assert (
        "  held-out: before training -> last evaluation: heldout/greedy_pass@1: 0.250 -> 0.500"
        in out
    )
    assert "  reward_mean: first -> last steps: 0.2 -> 0.5\n" in out
    assert out.rstrip().endswith(f"report: {tmp_path / 'out' / 'report.html'}")
