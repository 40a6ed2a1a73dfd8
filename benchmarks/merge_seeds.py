"""Pool the seeds of several results files (``--seeds``, or one seed each) into one over-seeds
table and plot.

    python -m benchmarks.merge_seeds benchmarks/results/2026-11-25-target-3.json \\
        benchmarks/results/2026-11-25-target-5.json --out benchmarks/results/2026-11-25-target-seeds

A five-seed median moves by several steps from chance alone, so a later run that adds seeds
(``--seeds 5,6``) should add to the earlier ones rather than replace them. The files must hold the
same workload, model, precision, threads and step budget on the same kind of machine, and no seed
twice. Every ratio to TRL still pairs two runs of one file (the same seed, alternating turns in
one run); the medians pool runs from different files, whose dates, load averages and measured
peaks the report lists. A side present in only some files (``trl-whole``) is summarised over the
seeds it ran.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.harness.machine import PEAK_DTYPE
from benchmarks.harness.report import LABELS, SIDES, isa_limits_text
from benchmarks.harness.seeds import over_seeds, plot_reward_vs_time, render_over_seeds

# what must agree between the files for their runs to be one sample (the workload's own default
# seed list differs from the seeds a run was given, so it is left out)
SAME = ("model", "precision", "threads", "steps", "warmup", "block")
MACHINE_KIND = ("cpu", "cores", "avx512_bf16", "isa_limits")


def _load(path: Path) -> dict:
    try:
        payload = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable results .json ({exc})") from None
    if "per_seed" not in payload:
        # a one-seed run (`--seed N`, or `--seeds` with one seed) keeps its sides at the
        # top level: it is that seed's entry
        sides, seed = payload.get("sides"), payload.get("seed")
        if not isinstance(sides, dict) or seed is None:
            raise ValueError(f"{path}: no per-seed runs and no one-seed run (not a step result?)")
        payload["per_seed"] = {str(seed): sides}
    return payload


def _settings(payload: dict) -> dict:
    workload = {k: v for k, v in payload["workload"].items() if k != "seeds"}
    machine = {k: payload["machine"].get(k) for k in MACHINE_KIND}
    return {"workload": workload, "machine": machine, **{k: payload.get(k) for k in SAME}}


def merge(paths: list[Path]) -> dict:
    """The merged payload: ``per_seed`` of every file (seeds in numeric order), ``over_seeds``
    recomputed over all of them, and ``sources`` (one entry per file). ValueError naming the
    file and the field when two files differ in a setting, or naming a seed given twice."""
    if len(paths) < 2:
        raise ValueError("give at least two results files to merge")
    payloads = [_load(p) for p in paths]
    first = _settings(payloads[0])
    per_seed: dict[str, dict] = {}
    owner: dict[str, Path] = {}
    for path, payload in zip(paths, payloads, strict=True):
        settings = _settings(payload)
        for key, value in settings.items():
            if value != first[key]:
                raise ValueError(
                    f"{path}: {key} is {json.dumps(value)}, {paths[0]} has "
                    f"{json.dumps(first[key])}: not one sample"
                )
        for seed, runs in payload["per_seed"].items():
            if seed in per_seed:
                raise ValueError(f"seed {seed} is in both {owner[seed]} and {path}")
            per_seed[seed], owner[seed] = runs, path
    per_seed = dict(sorted(per_seed.items(), key=lambda kv: int(kv[0])))
    sources = [
        {
            "file": Path(p).name,
            "date": d.get("date"),
            "time": d.get("time"),
            "seeds": [int(s) for s in d["per_seed"]],
            "sides": [s for s in SIDES if any(s in runs for runs in d["per_seed"].values())],
            "command": d.get("command"),
            "matmul_peak_gflops": d.get("matmul_peak_gflops"),
            "memory_bandwidth_gbs": d.get("memory_bandwidth_gbs"),
            "load_average_start": d.get("load_average_start"),
            "load_average_end": d.get("load_average_end"),
        }
        for p, d in zip(paths, payloads, strict=True)
    ]
    return {
        "sources": sources,
        "workload": payloads[0]["workload"],
        "machine": payloads[0]["machine"],
        **{k: payloads[0].get(k) for k in SAME},
        "per_seed": per_seed,
        "over_seeds": over_seeds(per_seed),
    }


def _peak(src: dict, precision: str) -> str:
    """The matmul peak of the precision the runs trained in, and the memory bandwidth."""
    peak = (src.get("matmul_peak_gflops") or {}).get(PEAK_DTYPE.get(precision, precision))
    bw = src.get("memory_bandwidth_gbs")
    parts = [f"{precision} {peak:.0f} GFLOP/s" if peak else None, f"{bw:.1f} GB/s" if bw else None]
    return ", ".join(p for p in parts if p) or "n/a"


def _load_text(src: dict) -> str:
    a, b = src.get("load_average_start"), src.get("load_average_end")
    return f"{a[0]:.2f} -> {b[0]:.2f}" if a and b else "n/a"


def render(merged: dict) -> str:
    """The merged report: where the runs came from, then the over-seeds table."""
    w, m = merged["workload"], merged["machine"]
    seeds = ", ".join(merged["per_seed"])
    lines = [
        f"# Benchmark `{w['name']}`: seeds {seeds} pooled from {len(merged['sources'])} runs",
        "",
        f"- Machine: {m.get('cpu')}, {m.get('cores')} cores, AVX512-BF16: "
        f"{'yes' if m.get('avx512_bf16') else 'no'}{isa_limits_text(m)}; precision "
        f"{merged.get('precision')}, "
        f"threads {merged.get('threads')}",
        f"- Workload: model {merged.get('model')}, {w['prompts_per_step']} prompts x "
        f"{w['group_size']} samples, at most {w['max_new_tokens']} new tokens, lr {w['lr']}, "
        f"target: {w['target_window']}-step mean reward {w['target_reward']}, at most "
        f"{merged.get('steps')} steps",
        "- Each ratio to TRL pairs two runs of one file (same seed, alternating turns); the "
        "medians pool runs of different files (their dates, peaks and load averages below).",
        "",
        "| file | date, end time (UTC) | seeds | sides | matmul peak, bandwidth "
        "| 1-min load, start -> end |",
        "|---|---|---|---|---|---|",
    ]
    for s in merged["sources"]:
        lines.append(
            f"| {s['file']} | {s['date']} {s['time']} | {', '.join(map(str, s['seeds']))} "
            f"| {', '.join(s['sides'])} | {_peak(s, merged['precision'])} | {_load_text(s)} |"
        )
    lines += render_over_seeds(merged["over_seeds"], LABELS)
    lines += ["", "Commands:", *[f"- `{s['command']}`" for s in merged["sources"]]]
    return "\n".join(lines).rstrip() + "\n"


def write(merged: dict, out: Path) -> tuple[Path, Path, Path]:
    """``out``.json, .md and .png (the reward of every run against wall time and step)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    js, md, png = (out.with_suffix(s) for s in (".json", ".md", ".png"))
    js.write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")
    w = merged["workload"]
    plot_reward_vs_time(merged["per_seed"], png, w["target_window"], w["target_reward"])
    md.write_text(
        render(merged) + f"\n![training reward against wall time and step, every run]({png.name})\n"
    )
    return js, md, png


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.merge_seeds",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "results",
        nargs="+",
        type=Path,
        help="results .json files of benchmarks.step (--seeds, or one seed)",
    )
    p.add_argument(
        "--out", type=Path, required=True, help="path without suffix: writes .json, .md and .png"
    )
    args = p.parse_args(argv)
    try:
        merged = merge(args.results)
    except ValueError as exc:
        print(f"merge_seeds: {exc}", file=sys.stderr)
        return 2
    for path in write(merged, args.out):
        print(f"[merge_seeds] wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
