"""The report's evaluation section: each run's last eval with how it was measured.

Rows name the mode, k, temperature and top-p, the share of replies cut at the token limit and
the mean reply length beside each number (`rlvr.eval.table`). Runs whose evals were measured
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

COLUMNS = ("value", "mode", "k", "temperature", "top_p", "truncated", "mean_len", "problems")


def last_eval(run_dir: Path) -> dict | None:
    """The run's newest ``eval/step_*.json`` payload, None when it has none."""
    files = sorted(Path(run_dir).glob("eval/step_*.json"))
    return json.loads(files[-1].read_text()) if files else None


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


def eval_section(runs: Sequence[RunData]) -> str:
    """HTML: one table row per run, set and metric of the run's last eval, then warnings."""
    cells = []
    for run in runs:
        payload = last_eval(run.path)
        if not payload or "modes" not in payload:
            continue
        problems = {
            name: len(next(iter(recs.values()), []))
            for name, recs in payload.get("records", {}).items()
        }
        prov = payload.get("provenance") or {}
        measured = f"{prov.get('engine', '?')}, {prov.get('dtype', '?')}"
        rows = eval_rows(payload["results"], payload["modes"], problems)
        for label, row in rows.items():
            values = "".join(f"<td>{html.escape(_fmt(row[c]))}</td>" for c in COLUMNS)
            cells.append(
                f"<tr><td>{html.escape(run.label)}</td><td>{payload.get('step', '-')}</td>"
                f"<td>{html.escape(label)}</td>{values}<td>{html.escape(measured)}</td></tr>"
            )
    if not cells:
        return ""
    warnings = provenance_warnings(runs)
    for warning in warnings:
        print(f"[rlvr] warning: {warning}", file=sys.stderr)
    warn_html = "".join(f"<li>{html.escape(w)}</li>" for w in warnings)
    head = "".join(f"<th>{c}</th>" for c in ("run", "step", "set metric", *COLUMNS, "measured"))
    return (
        "<h2>Evaluation (last eval of each run)</h2>"
        + (f"<ul class='note'>{warn_html}</ul>" if warn_html else "")
        + f"<table><tr>{head}</tr>{''.join(cells)}</table>"
    )


def _fmt(value: object) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)
