"""What the checks against TRL share (``grad_vs_trl``, ``pipeline_vs_trl``): their common
arguments, the precision and TRL's venv they run with, and how their results are written."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from benchmarks.harness.machine import PRECISIONS, bench_precision
from benchmarks.harness.runner import REPO
from benchmarks.harness.seeds import parse_seeds
from benchmarks.harness.trl_env import ensure_trl_env
from benchmarks.harness.workloads import Workload, get_workload
from benchmarks.step import prepare_model


def add_common_args(p: argparse.ArgumentParser, *, precision: str, seeds_help: str) -> None:
    p.add_argument("--seeds", default="0", help=seeds_help)
    p.add_argument("--precision", default=precision, choices=("auto", *PRECISIONS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--trl-venv", type=Path, default=REPO / "benchmarks" / ".venv-trl")
    p.add_argument("--no-install", action="store_true", help="fail instead of creating TRL's venv")


def resolve(
    p: argparse.ArgumentParser, args: argparse.Namespace, tag: str
) -> tuple[list[int], str, Path] | None:
    """The seeds, the precision this CPU runs and TRL's Python; a bad ``--seeds`` exits through
    ``p.error``, a missing TRL venv (with ``--no-install``) prints why and returns None."""
    try:
        seeds = parse_seeds(args.seeds)
    except ValueError as exc:
        p.error(str(exc))
    from rlvr.model.precision import bf16_supported

    precision, _ = bench_precision(args.precision, bf16_supported("cpu"))
    try:
        trl_python = ensure_trl_env(args.trl_venv, install=not args.no_install)
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"[{tag}] {exc}", file=sys.stderr)
        return None
    return seeds, precision, trl_python


def target_model(tag: str) -> tuple[Workload, Path, Path]:
    """The ``target`` workload, a fresh work folder (``rlvr-<tag>-vs-trl-*``) and the workload's
    model converted into it."""
    w = get_workload("target")
    work = Path(tempfile.mkdtemp(prefix=f"rlvr-{tag}-vs-trl-"))
    return w, work, prepare_model(w.model, work)


def trl_version(trl_python: Path) -> str:
    return subprocess.run(
        [str(trl_python), "-c", "import trl; print(trl.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def write_results(stem: Path, payload: dict, render: Callable[[dict], str]) -> None:
    """``stem``.json (the payload) and ``stem``.md (``render(payload)``, also printed)."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(payload, indent=1) + "\n")
    text = render(payload)
    stem.with_suffix(".md").write_text(text)
    print(text)
