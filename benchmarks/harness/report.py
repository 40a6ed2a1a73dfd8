"""The results files: ``<date>-<workload>.json`` (everything) and ``.md`` (the table)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from benchmarks.harness.seeds import over_seeds, plot_reward_vs_time, render_over_seeds
from benchmarks.harness.stats import safe_ratio

# Column order of the table (whatever the order of turns was); the rlvr sides differ only in
# their rollout engine. Older results files hold "rlvr" (transformers) and "trl" only.
SIDES = ("rlvr", "rlvr-vllm", "trl", "trl-whole", "trl-gc")
LABELS = {
    "rlvr": "rlvr (transformers)",
    "rlvr-vllm": "rlvr (vLLM)",
    "trl": "TRL",
    "trl-whole": "TRL, whole batch",
    "trl-gc": "TRL, gradient checkpointing",
}
# the phases set against their physical bound (bounds.py), with the bound each one has
BOUND_LABELS = (
    ("generation (weights + KV cache read per decoding step / memory bandwidth)", "generate"),
    ("update (6 FLOPs per parameter per token / matmul peak)", "update"),
    ("weight sync (weights read + written / memory bandwidth)", "sync"),
)
PEER = "trl"
# matmul-peak keys (torch dtype names) as the report writes them
NAMES = {"bfloat16": "bf16"}
# one ratio column per rlvr side present, against TRL
RATIO_LABELS = {"rlvr": "rlvr/TRL", "rlvr-vllm": "rlvr+vLLM/TRL"}


def _num(v, fmt: str = "{:.2f}") -> str:
    return "n/a" if v is None else fmt.format(v)


def table_columns(present) -> tuple[list[str], list[str]]:
    """(the sides shown, in table order; the rlvr sides that get a ratio column against TRL)."""
    shown = [s for s in SIDES if s in present]
    ratios = [s for s in RATIO_LABELS if s in shown] if PEER in shown else []
    return shown, ratios


def table_header(present) -> list[str]:
    """The header and separator lines of the table for the sides ``present``."""
    shown, ratios = table_columns(present)
    cols = ["figure", *(LABELS[s] for s in shown), *(RATIO_LABELS[s] for s in ratios)]
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]


def _ratio_cell(num, den) -> str:
    r = safe_ratio(num, den)
    return "n/a" if r is None else f"{r:.2f}"


def _row(name: str, sides: dict, get: Callable[[dict], object], fmt: str, ratio: bool) -> str:
    shown, ratio_sides = table_columns(sides)
    vals = {s: get(sides[s]) for s in shown}
    cells = [_num(vals[s], fmt) for s in shown]
    cells += [_ratio_cell(vals[s], vals[PEER]) if ratio else "" for s in ratio_sides]
    return "| " + " | ".join([name, *cells]) + " |"


def _engines_text(payload: dict) -> str | None:
    """Which rollout engine each rlvr side reported at start-up (results from before had none)."""
    parts = []
    for s in SIDES:
        ready = payload["sides"].get(s, {}).get("ready") or {}
        if ready.get("engine"):
            version = (ready.get("versions") or {}).get(ready["engine"])
            parts.append(
                f"{LABELS[s]} `rollout.engine={ready['engine']}`"
                + (f" ({ready['engine']} {version})" if version else "")
            )
    return ", ".join(parts) if parts else None


def _allocators_text(payload: dict) -> str | None:
    """The malloc each side's worker had mapped (results from before recorded none)."""
    parts = [
        f"{LABELS[s]} {ready['allocator']}"
        for s in SIDES
        if (ready := payload["sides"].get(s, {}).get("ready") or {}).get("allocator")
    ]
    return ", ".join(parts) if parts else None


def _warmup_text(payload: dict) -> str:
    """How many first steps each side left out (a target run that stopped early keeps more)."""
    used = {
        LABELS.get(s, s): payload["sides"][s]["summary"].get("warmup_used", payload["warmup"])
        for s in table_columns(payload["sides"])[0]
    }
    counts = set(used.values())
    if len(counts) == 1:
        return f"first {counts.pop()} left out as warm-up"
    return "warm-up steps left out: " + ", ".join(f"{k} {v}" for k, v in used.items())


def isa_limits_text(machine: dict) -> str:
    """`` (instruction set capped: ONEDNN_MAX_CPU_ISA=AVX2, ...)`` when the run emulated an older
    CPU (``machine.isa_limits``), else empty."""
    limits = machine.get("isa_limits")
    if not limits:
        return ""
    return " (instruction set capped: " + ", ".join(f"{k}={v}" for k, v in limits.items()) + ")"


def render_markdown(payload: dict) -> str:
    """A markdown report: the run's context, then one row per figure with a column per side and
    a ratio column per rlvr side against TRL (when TRL ran)."""
    w = payload["workload"]
    sides = {s: payload["sides"][s]["summary"] for s in payload["sides"]}
    shown, _ = table_columns(sides)
    names = [LABELS[s] if s != PEER else "TRL GRPOTrainer" for s in shown]
    title = " vs ".join(names)
    engines = _engines_text(payload)
    allocators = _allocators_text(payload)
    la0, la1 = payload["load_average_start"], payload["load_average_end"]
    m = payload["machine"]
    precision = payload.get("precision", "bf16")  # files written before --precision: bf16
    lines = [
        f"# Benchmark `{w['name']}`: {title} ({payload['date']})",
        "",
        f"- Machine: {m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB" + isa_limits_text(m) + "; "
        f"load average (1/5/15 min) at start {la0[0]:.2f}/{la0[1]:.2f}/{la0[2]:.2f}, "
        f"at end {la1[0]:.2f}/{la1[1]:.2f}/{la1[2]:.2f}",
        f"- Precision: {precision}"
        + (f" ({payload['precision_reason']})" if payload.get("precision_reason") else "")
        + f"; matmul peak (2048x2048, threads: {payload['threads']}): "
        + ", ".join(
            f"{NAMES.get(dt, dt)} {v:.0f} GFLOP/s"
            for dt, v in payload["matmul_peak_gflops"].items()
        )
        + "; the update is set against "
        f"the {precision} peak"
        + (
            f"; memory bandwidth (256 MiB copy): {payload['memory_bandwidth_gbs']:.1f} GB/s"
            if "memory_bandwidth_gbs" in payload
            else ""
        ),
        f"- Workload: model {payload['model']}, {w['prompts_per_step']} prompts x "
        f"{w['group_size']} samples, at most {w['max_new_tokens']} new tokens, lr {w['lr']:g} "
        f"constant, Dr.GRPO, beta 0, one update per batch, micro-batch {w['micro_batch']}"
        + (
            f" (TRL, whole batch: {w['prompts_per_step'] * w['group_size']})"
            if "trl-whole" in sides
            else ""
        )
        + ", "
        f"seed {payload['seed']}, threads: {payload['threads']}, {precision}",
        f"- Steps per side: {payload['steps']} ({_warmup_text(payload)}), "
        f"alternating blocks of {payload['block']}; same prompts on all sides: "
        f"{payload['prompts_match']}",
        *([f"- Rollout engines: {engines}"] if engines else []),
        *([f"- malloc: {allocators}"] if allocators else []),
        f"- Command: `{payload['command']}`",
        "",
        *table_header(sides),
    ]

    def phase(p):
        return lambda s: s["phase_median_s"].get(p)

    def at_bound(p):
        return lambda s: (
            None if p not in s.get("phase_at_bound", {}) else 100 * s["phase_at_bound"][p]
        )

    rows = [
        ("step time, median (s)", lambda s: s["step_time_median_s"], "{:.2f}", True),
        ("step time, IQR (s)", lambda s: s["step_time_iqr_s"], "{:.2f}", False),
        ("- generation (s, median)", phase("generate"), "{:.2f}", True),
        ("- reward (s, median)", phase("reward"), "{:.3f}", True),
        ("- no-grad log-prob passes (s, median)", phase("logprob"), "{:.2f}", True),
        ("- update: fwd+bwd+optimizer (s, median)", phase("update"), "{:.2f}", True),
        ("- weight sync (s, median)", phase("sync"), "{:.2f}", False),
        ("- other (s, median)", phase("other"), "{:.2f}", True),
        ("completion length, mean (tokens)", lambda s: s["completion_len_mean"], "{:.1f}", True),
        ("generated tokens/s", lambda s: s["gen_tokens_per_s"], "{:.1f}", True),
        ("trained tokens/s", lambda s: s["trained_tokens_per_s"], "{:.1f}", True),
        ("end-to-end tokens/s", lambda s: s["e2e_tokens_per_s"], "{:.1f}", True),
        (
            "training GFLOP/s",
            lambda s: None if s["train_flops_per_s"] is None else s["train_flops_per_s"] / 1e9,
            "{:.1f}",
            True,
        ),
        (
            "training, % of matmul peak",
            lambda s: None if s["train_peak_fraction"] is None else 100 * s["train_peak_fraction"],
            "{:.1f}",
            True,
        ),
        *[(f"- {label}, % of bound", at_bound(p), "{:.1f}", True) for label, p in BOUND_LABELS],
        ("peak RSS, children included (MB)", lambda s: s.get("peak_rss_mb"), "{:.0f}", True),
        ("start-up until first step (s)", lambda s: s.get("startup_s"), "{:.1f}", True),
        ("training reward, mean", lambda s: s["reward_mean"], "{:.3f}", False),
    ]
    if w.get("target_reward") is not None:
        rows += [
            (
                f"time to {w['target_window']}-step mean reward {w['target_reward']} (s)",
                lambda s: s.get("time_to_target_s"),
                "{:.0f}",
                True,
            ),
            ("... reached at step", lambda s: s.get("time_to_target_step"), "{:.0f}", False),
        ]
    lines += [_row(name, sides, get, fmt, ratio) for name, get, fmt, ratio in rows]
    if "over_seeds" in payload:
        lines += render_over_seeds(payload["over_seeds"], LABELS)
    lines += ["", *[f"- {n}" for n in payload.get("notes", [])]]
    return "\n".join(lines).rstrip() + "\n"


def results_paths(out_dir: Path, date: str, workload: str) -> tuple[Path, Path]:
    """``<date>-<workload>.json`` / ``.md`` in ``out_dir``; ``-2``, ``-3``... if taken."""
    out_dir = Path(out_dir)
    stem = f"{date}-{workload}"
    n = 1
    while (out_dir / f"{stem}.json").exists() or (out_dir / f"{stem}.md").exists():
        n += 1
        stem = f"{date}-{workload}-{n}"
    return out_dir / f"{stem}.json", out_dir / f"{stem}.md"


def write_results(
    out_dir: Path, payload: dict, paths: tuple[Path, Path] | None = None
) -> tuple[Path, Path]:
    """Write the payload as .json and .md: to ``paths`` when given (a run rewriting its own
    files after every seed), else to fresh ``results_paths``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    js, md = paths or results_paths(out_dir, payload["date"], payload["workload"]["name"])
    js.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
    md.write_text(render_markdown(payload))
    if "per_seed" in payload:
        w = payload["workload"]
        png = plot_reward_vs_time(
            payload["per_seed"], js.with_suffix(".png"), w["target_window"], w["target_reward"]
        )
        with open(md, "a") as f:
            f.write(f"\n![training reward against wall time and step, every run]({png.name})\n")
    return js, md


def rerender(js: Path) -> Path:
    """Rewrite a results file's .md (and plot) from its .json with today's figures: the
    over-seeds spreads are recomputed from the raw per-step data the file keeps."""
    js = Path(js)
    payload = json.loads(js.read_text())
    if "per_seed" in payload:
        payload["over_seeds"] = over_seeds(payload["per_seed"])
    return write_results(js.parent, payload, (js, js.with_suffix(".md")))[1]


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m benchmarks.harness.report",
        description="Re-render benchmark results files (.md and plot) from their .json.",
    )
    p.add_argument("results", nargs="+", type=Path, help="benchmarks/results/<date>-<name>.json")
    args = p.parse_args(argv)
    for js in args.results:
        if not js.is_file() or js.suffix != ".json":
            p.error(f"{js}: not a results .json file")
        print(f"[report] wrote {rerender(js)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
