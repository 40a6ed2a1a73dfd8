"""The report's evaluation section: each run's evaluation before training against its last one
(before -> after), with how they were measured.

Rows name the mode, k, temperature and top-p, the share of replies cut at the token limit and
the mean reply length beside each number (`rlvr.eval.table`), before and after. Runs whose evals were measured
differently (dtype, engine, token limit, machine, versions: `rlvr.eval.provenance`), and evals
of one run that differ from each other, get a warning naming the fields, on the page and on
stderr.
"""

from __future__ import annotations

import html
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from rlvr.eval.provenance import differences, warn_if_different
from rlvr.eval.table import eval_rows
from rlvr.telemetry.report_data import RunData

SETTINGS = ("mode", "k", "temperature", "top_p", "problems")


def eval_files(run_dir: Path) -> list[Path]:
    return sorted(Path(run_dir).glob("eval/step_*.json"))


def last_eval(run_dir: Path) -> dict | None:
    """The run's newest ``eval/step_*.json`` payload, None when it has none."""
    files = eval_files(run_dir)
    return json.loads(files[-1].read_text()) if files else None


def first_eval(run_dir: Path) -> dict | None:
    """The run's evaluation before training (``eval/step_000000.json``), None without one."""
    path = Path(run_dir) / "eval" / "step_000000.json"
    return json.loads(path.read_text()) if path.exists() else None


def provenance_warnings(runs: Sequence[RunData]) -> list[str]:
    """Across runs (last evals side by side) and within each run (its eval rows over time)."""
    last = {run.label: (last_eval(run.path) or {}).get("provenance") or {} for run in runs}
    out = warn_if_different(last)
    for run in runs:
        logged = [(m["step"], m["eval/provenance"]) for m in run.metrics if "eval/provenance" in m]
        for (s0, p0), (s1, p1) in zip(logged, logged[1:], strict=False):
            diff = differences(p0, p1)
            if diff:
                out.append(
                    f"{run.label}: the eval at step {s1} was measured differently from step "
                    f"{s0}: " + "; ".join(diff)
                )
    return out


def _rows(payload: dict | None) -> dict[str, dict]:
    if not payload or "modes" not in payload:
        return {}
    problems = {
        name: len(next(iter(recs.values()), []))
        for name, recs in payload.get("records", {}).items()
    }
    return eval_rows(payload["results"], payload["modes"], problems)


def _change(before: object, after: object) -> str:
    if isinstance(before, float) and isinstance(after, float):
        return f"{after - before:+.4f}"
    return "-"


def _pair(before: object, after: object) -> str:
    return f"{_fmt(before)} -> {_fmt(after)}" if before is not None else _fmt(after)


def eval_section(runs: Sequence[RunData]) -> str:
    """HTML: one row per run, set and metric: the evaluation before training, the last one and
    the change, with the mode, the truncated share and the reply length of each; then
    warnings."""
    cells = []
    for run in runs:
        last = last_eval(run.path)
        after = _rows(last)
        first = first_eval(run.path)
        before = _rows(first) if first is not None and first is not last else {}
        if first is not None and last is not None and first.get("step") == last.get("step"):
            before = {}  # one evaluation only: nothing to compare
        prov = (last or {}).get("provenance") or {}
        measured = f"{prov.get('engine', '?')}, {prov.get('dtype', '?')}"
        for label, row in after.items():
            was = before.get(label, {})
            settings = "".join(f"<td>{html.escape(_fmt(row[c]))}</td>" for c in SETTINGS)
            cells.append(
                f"<tr><td>{html.escape(run.label)}</td><td>{html.escape(label)}</td>"
                f"<td>{_fmt(was.get('value', '-'))}</td><td>{_fmt(row['value'])}</td>"
                f"<td>{_change(was.get('value'), row['value'])}</td>"
                f"<td>{html.escape(_pair(was.get('truncated'), row['truncated']))}</td>"
                f"<td>{html.escape(_pair(was.get('mean_len'), row['mean_len']))}</td>"
                f"{settings}<td>{last.get('step', '-') if last else '-'}</td>"
                f"<td>{html.escape(measured)}</td></tr>"
            )
    if not cells:
        return ""
    warnings = provenance_warnings(runs)
    for warning in warnings:
        print(f"[rlvr] warning: {warning}", file=sys.stderr)
    warn_html = "".join(f"<li>{html.escape(w)}</li>" for w in warnings)
    columns = (
        "run",
        "set metric",
        "before training",
        "after",
        "change",
        "truncated",
        "mean_len",
        *SETTINGS,
        "last step",
        "measured",
    )
    head = "".join(f"<th>{c}</th>" for c in columns)
    return (
        "<h2>Evaluation: before training -> the last evaluation</h2>"
        + (f"<ul class='note'>{warn_html}</ul>" if warn_html else "")
        + f"<table><tr>{head}</tr>{''.join(cells)}</table>"
    )


def _fmt(value: object) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)
