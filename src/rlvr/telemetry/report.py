"""``rlvr report``: one HTML page with plots, config differences, health events and samples.

The page is ``out_dir/report.html``; its PNG plots sit in ``out_dir/plots/`` and are referenced
by relative path, so the folder can be copied or zipped as a whole. Several run directories are
drawn on the same axes, one colour per run.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlvr.jsonio import atomic_write_text
from rlvr.telemetry.plots import PLOTS
from rlvr.telemetry.report_data import (
    ABSENT,
    RunData,
    config_diff,
    load_run,
    run_labels,
    run_state,
    series,
)
from rlvr.telemetry.report_eval import eval_section

REPORT_FILE = "report.html"
PLOTS_DIR = "plots"
SAMPLES_PER_STEP = 3
MAX_TEXT_CHARS = 2000
DPI = 90

_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.2em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.9em; color: #555; }
pre { white-space: pre-wrap; background: #f8f8f8; padding: 6px; margin: 0; max-height: 20em;
      overflow: auto; }
.stop { background: #fde2e2; } .warn { background: #fff4d6; } .absent { color: #999; }
.note { color: #555; font-size: 0.9em; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _show(value: Any) -> str:
    """A config / metric value as escaped HTML text."""
    if value is ABSENT:
        return '<span class="absent">(absent)</span>'
    if isinstance(value, str):
        return _e(value)
    return _e(json.dumps(value, ensure_ascii=False, default=str))


def _fmt_number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _ends(values, k: int = 3) -> tuple[float, float] | None:
    """Mean of the first and of the last ``k`` values (fewer on a short run), None when empty."""
    finite = [float(v) for v in values if v == v]
    if not finite:
        return None
    k = max(1, min(k, len(finite) // 2))
    return sum(finite[:k]) / k, sum(finite[-k:]) / k


def _first_last(run: RunData, key: str) -> str:
    ends = _ends(series(run.metrics, key)[1])
    return "-" if ends is None else f"{ends[0]:.3g} -> {ends[1]:.3g}"


def _eval_change(run: RunData) -> str:
    """The held-out scores before training -> at the last evaluation (pass@k, maj@k)."""
    evals = [m for m in run.metrics if any(k.startswith("eval/") for k in m)]
    if not evals:
        return "no evaluation"
    first, last = evals[0], evals[-1]
    keys = [k for k in last if k.startswith("eval/") and "@" in k and isinstance(last[k], float)]
    if not keys:
        return "no score"
    parts = []
    for key in keys:
        name = key.removeprefix("eval/")
        was = first.get(key) if first is not last and first.get("step") == 0 else None
        if isinstance(was, float):
            parts.append(f"{name}: {was:.3f} -> {last[key]:.3f} ({last[key] - was:+.3f})")
        elif last.get("step") == 0:
            parts.append(f"{name}: {last[key]:.3f} before training; no evaluation after training")
        else:
            parts.append(f"{name}: {last[key]:.3f} (step {last.get('step')})")
    for key, now in last.items():  # each score beside its replies cut at the token limit
        if not (key.startswith("eval/") and key.endswith("/truncated_frac")):
            continue
        name = key.removeprefix("eval/").removesuffix("/truncated_frac")
        was = first.get(key) if first is not last and first.get("step") == 0 else None
        if now or was:
            cut = f"{was:.0%} -> {now:.0%}" if isinstance(was, float) else f"{now:.0%}"
            parts.append(f"{name} replies cut at the token limit: {cut}")
    return "; ".join(parts)


def _failures(run: RunData) -> str:
    """Training replies whose reward raised, and held-out gradings that raised at the last
    evaluation (graded wrong: the held-out score counts them as wrong answers)."""
    parts = []
    steps, rates = series(run.metrics, "reward_failure_rate")
    if len(rates) and rates.max() > 0:
        worst = int(rates.argmax())
        parts.append(
            f"{rates.mean():.0%} of replies (at most {rates[worst]:.0%}, step "
            f"{int(steps[worst])}): their messages are in samples/ ('reward_error')"
        )
    evals = [m for m in run.metrics if any(k.startswith("eval/") for k in m)]
    last = evals[-1] if evals else {}
    for key, value in last.items():
        if key.startswith("eval/") and key.endswith("/reward_failed_frac") and value:
            where = key.removeprefix("eval/").removesuffix("/reward_failed_frac")
            parts.append(
                f"held-out {where}: {value:.0%} of gradings raised at the last evaluation "
                "(graded wrong; their messages: eval/step_N.json 'reward_errors')"
            )
    return "; ".join(parts) or "none"


SUMMARY_COLUMNS = (
    "run",
    "run state",
    "steps",
    "held-out: before training -> last evaluation",
    "reward_mean: first -> last steps",
    "correct: first -> last steps",
    "reward failures",
    "truncated (last step)",
    "health",
)
SUMMARY_FILE = "did_it_work.txt"  # the first table as text, beside report.html


def _summary_rows(runs: Sequence[RunData]) -> list[list[str]]:
    """Did it work? Per run (SUMMARY_COLUMNS): how it ended, its steps, held-out scores before
    -> after, the training reward's start -> end, reward failures, truncation, health."""
    rows = []
    for run in runs:
        steps, _ = series(run.metrics, "step")
        trained = int(steps.max()) if len(steps) else 0
        planned = (run.config or {}).get("train.max_steps")
        _, trunc = series(run.metrics, "truncation_rate")
        status = (run.health or {}).get("status", "no health event")
        rows.append(
            [
                run.label,
                run_state(run.status),
                f"{trained} of {planned}" if isinstance(planned, int) else str(trained),
                _eval_change(run),
                _first_last(run, "reward_mean"),
                _first_last(run, "correct"),
                _failures(run),
                f"{trunc[-1]:.0%}" if len(trunc) else "-",
                status,
            ]
        )
    return rows


def summary_text(runs: Sequence[RunData]) -> str:
    """The "Did it work?" table as text: one block per run (`rlvr report` prints it)."""
    lines = ["Did it work?"]
    for row in _summary_rows(runs):
        label, state, steps, *rest = row
        lines.append(f"{label}: {state}, {steps} steps")
        lines += [f"  {c}: {v}" for c, v in zip(SUMMARY_COLUMNS[3:], rest, strict=True)]
    return "\n".join(lines) + "\n"


def _summary_section(runs: Sequence[RunData]) -> str:
    """The "Did it work?" table (`_summary_rows`)."""
    rows = [
        "<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>"
        for cells in _summary_rows(runs)
    ]
    head = "".join(f"<th>{_e(c)}</th>" for c in SUMMARY_COLUMNS)
    return (
        "<h2>Did it work?</h2><p class='note'>Held-out scores before training and at the last "
        "evaluation; the training reward averaged over the first and the last three steps (fewer "
        "on a short run).</p>"
        f"<table><tr>{head}</tr>{''.join(rows)}</table>"
    )


def _runs_section(runs: Sequence[RunData]) -> str:
    rows = []
    for run in runs:
        steps, _ = series(run.metrics, "step")
        span = f"{int(steps.min())}-{int(steps.max())}" if len(steps) else "-"
        rows.append(
            f"<tr><td>{_e(run.label)}</td><td>{_e(run.path)}</td><td>{len(run.metrics)}</td>"
            f"<td>{span}</td></tr>"
        )
    missing, expected = [], []
    for run in runs:
        if not run.metrics:
            missing.append(f"<li>{_e(run.label)}: no metrics.jsonl lines</li>")
            continue
        why = run.expected_absent()
        keys = run.missing_contract_keys()
        surprise = [k for k in keys if k not in why]
        if surprise:
            missing.append(f"<li>{_e(run.label)}: {_e(', '.join(surprise))}</li>")
        by_reason: dict[str, list[str]] = {}
        for k in keys:
            if k in why:
                by_reason.setdefault(why[k], []).append(k)
        expected += [
            f"<li>{_e(run.label)}: {_e(', '.join(ks))} ({_e(reason)})</li>"
            for reason, ks in by_reason.items()
        ]
    missing_html = (
        "<p class='note'>Metrics of the contract this run should have logged and never did (a "
        "metric that silently stopped being produced):</p>"
        f"<ul class='note'>{''.join(missing)}</ul>"
        if missing
        else ""
    )
    expected_html = (
        "<p class='note'>Not logged, as expected for this run:</p>"
        f"<ul class='note'>{''.join(expected)}</ul>"
        if expected
        else ""
    )
    return (
        "<h2>Runs</h2><table><tr><th>run</th><th>directory</th><th>lines</th><th>steps</th>"
        f"</tr>{''.join(rows)}</table>{missing_html}{expected_html}"
    )


def _plots_section(runs: Sequence[RunData], out_dir: Path) -> str:
    plot_dir = out_dir / PLOTS_DIR
    plot_dir.mkdir(parents=True, exist_ok=True)
    parts = ["<h2>Plots</h2>"]
    for stem, caption, build in PLOTS:
        fig = build(runs)
        if fig is None:
            continue  # metric absent from every run
        path = plot_dir / f"{stem}.png"
        fig.savefig(path, dpi=DPI, format="png")
        src = f"{PLOTS_DIR}/{stem}.png"
        parts.append(
            f'<figure><img src="{_e(src)}" alt="{_e(caption)}">'
            f"<figcaption>{_e(caption)}</figcaption></figure>"
        )
    if len(parts) == 1:
        parts.append("<p class='note'>No plottable metrics in these runs.</p>")
    return "".join(parts)


def _config_section(runs: Sequence[RunData]) -> str:
    head = "<h2>Config differences</h2>"
    with_config = [run for run in runs if run.config is not None]
    if len(runs) < 2:
        note = "<p class='note'>One run: nothing to compare.</p>"
    elif not with_config:
        note = "<p class='note'>No run has a config.yaml.</p>"
    else:
        rows = config_diff([run.config for run in runs])
        if rows:
            header = "".join(f"<th>{_e(run.label)}</th>" for run in runs)
            body = "".join(
                f"<tr><td>{_e(key)}</td>{''.join(f'<td>{_show(v)}</td>' for v in values)}</tr>"
                for key, values in rows
            )
            note = f"<table><tr><th>key</th>{header}</tr>{body}</table>"
        else:
            note = "<p class='note'>The configs are identical.</p>"
    details = []
    for run in with_config:
        body = "".join(
            f"<tr><td>{_e(k)}</td><td>{_show(v)}</td></tr>" for k, v in sorted(run.config.items())
        )
        details.append(
            f"<details><summary>Full config of {_e(run.label)}</summary>"
            f"<table>{body}</table></details>"
        )
    return head + note + "".join(details)


def _health_section(runs: Sequence[RunData]) -> str:
    parts = ["<h2>Health events</h2>"]
    for run in runs:
        health = run.health
        if health is None:
            parts.append(f"<p class='note'>{_e(run.label)}: no health record.</p>")
            continue
        events = health.get("events", [])
        stopped = health.get("stopped_by")
        headline = f"{_e(run.label)}: status {_e(health.get('status', '?'))}"
        if stopped:
            headline += f", stopped by {_e(stopped.get('rule'))} at step {_e(stopped.get('step'))}"
        parts.append(f"<h3>{headline}</h3>")
        if not events:
            parts.append("<p class='note'>No events.</p>")
            continue
        rows = []
        for event in events:
            action = str(event.get("action", ""))
            values = event.get("values", {})
            shown = ", ".join(f"{k}={_fmt_number(v)}" for k, v in dict(values).items())
            rows.append(
                f"<tr class='{_e(action)}'><td>{_e(event.get('step'))}</td>"
                f"<td>{_e(event.get('rule'))}</td><td>{_e(action)}</td><td>{_e(shown)}</td>"
                f"<td>{_e(event.get('advice', ''))}</td></tr>"
            )
        parts.append(
            "<table><tr><th>step</th><th>rule</th><th>action</th><th>values</th>"
            f"<th>advice</th></tr>{''.join(rows)}</table>"
        )
    return "".join(parts)


def _clip(text: str) -> str:
    if len(text) <= MAX_TEXT_CHARS:
        return text
    return text[:MAX_TEXT_CHARS] + f"\n... ({len(text) - MAX_TEXT_CHARS} more characters)"


def _samples_section(runs: Sequence[RunData]) -> str:
    parts = ["<h2>Sampled completions</h2>"]
    for run in runs:
        if not run.samples:
            parts.append(f"<p class='note'>{_e(run.label)}: no samples/ files.</p>")
            continue
        for step, records in run.samples:
            parts.append(f"<h3>{_e(run.label)}, step {step}</h3>")
            for record in records[:SAMPLES_PER_STEP]:
                cells = []
                for key, value in record.items():
                    if isinstance(value, str):
                        shown = f"<pre>{_e(_clip(value))}</pre>"
                    elif key == "turns" and isinstance(value, list):  # an episode, turn by turn
                        shown = "".join(
                            f"<p><b>{_e(str(t.get('role')))}</b></p>"
                            f"<pre>{_e(_clip(str(t.get('text', ''))))}</pre>"
                            for t in value
                            if isinstance(t, dict)
                        )
                    else:
                        shown = _show(value)
                    cells.append(f"<tr><th>{_e(key)}</th><td>{shown}</td></tr>")
                parts.append(f"<table>{''.join(cells)}</table>")
    return "".join(parts)


def write_report(run_dirs: Sequence[Path], out_dir: Path) -> Path:
    """Draw one or more run directories into ``out_dir/report.html``; returns its path.

    Plots whose metrics no run logged are left out; a run with a single step, no samples, no
    config or no health record still gets a page.
    """
    if not run_dirs:
        raise ValueError("write_report needs at least one run directory")
    paths = [Path(p) for p in run_dirs]
    runs = [load_run(p, label) for p, label in zip(paths, run_labels(paths), strict=True)]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().isoformat(timespec="seconds")
    title = "rlvr report: " + ", ".join(run.label for run in runs)
    atomic_write_text(out_dir / SUMMARY_FILE, summary_text(runs))
    body = "".join(
        [
            f"<h1>{_e(title)}</h1><p class='note'>Generated {_e(stamp)}.</p>",
            _summary_section(runs),
            eval_section(runs),
            _runs_section(runs),
            _plots_section(runs, out_dir),
            _config_section(runs),
            _health_section(runs),
            _samples_section(runs),
        ]
    )
    page = (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>{body}</body></html>\n"
    )
    path = out_dir / REPORT_FILE
    atomic_write_text(path, page)
    return path
