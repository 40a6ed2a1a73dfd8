"""rlvr against TRL's GRPOTrainer on one GPU at equal work (issue 47; docs/gpu.md).

``python -m benchmarks.gpu.bench --out DIR`` (run by ``run.sh`` on the device machine), or
``--dry`` for the CPU dry mode CI runs (tiny shape, a few tokens; the TRL side is skipped with a
line saying so where TRL is not installed).

Equal work: the same model shape (Qwen2.5 configs in ``shapes/``, random weights), the same
prompts in the same order (``harness/workloads.step_schedule``, checked by digest), group size,
Dr.GRPO with beta 0, fp32 weights under bf16 autocast, no gradient checkpointing on either side
(TRL's configs turn it on by default: ``worker_trl.grpo_args`` turns it off, rlvr's
``model.gradient_checkpointing`` is off and ``worker_rlvr.config_overrides`` says so; each
side's JSON has ``activation_checkpointing`` as read from its model), transformers
generation on both sides, and replies of exactly ``--new-tokens`` tokens: the tokenizer's EOS lies beyond the model's rows
(``rlvr.training.tiny.build_fixed_length_tokenizer``), so neither sampler can stop early. Each
side runs alone in its own process (``worker.py``). Figures over the steps after ``--warmup``:
step, generation and update time (medians), tokens/s, peak GPU memory (the largest of the
measured steps' own ``torch.cuda.max_memory_allocated``, read the same way on both sides by
``worker.Recorder``), update MFU against this card's measured bf16 matmul peak, each with its
rlvr/TRL ratio.

The JSON and the tables are written after every side, so a side that fails or runs out of time
(a row saying so, its log's tail in the JSON), or the caller's own timeout, still leaves what ran.
``--deadline`` (seconds since the epoch) is when the last side must end: a side gets what is left
of it (at most ``--timeout``) and none starts with less than ``MIN_SIDE_S`` left. ``--append``
adds this call's shapes to an earlier call's ``--stem`` files (run.sh's second benchmark stage).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.harness.stats import safe_ratio, summarize_side
from benchmarks.harness.workloads import Workload, step_schedule

ROOT = Path(__file__).resolve().parents[2]
SHAPES = Path(__file__).with_name("shapes")
GPU_SHAPES = ("qwen2.5-0.5b", "qwen2.5-1.5b")
# rlvr with transformers' SDPA, so the update pads (the A/B of the packed update on the card)
PADDED = "rlvr-padded"
# a side needs at least this long to start, build its trainer and run its steps
MIN_SIDE_S, MIN_SIDE_S_DRY = 30, 5
# (label, summary key, scale, format); the ratio column is rlvr / TRL
ROWS = (
    ("step time (s, median)", "step_time_median_s", 1.0, "{:.2f}"),
    ("generation (s, median)", ("phase_median_s", "generate"), 1.0, "{:.2f}"),
    ("update (s, median)", ("phase_median_s", "update"), 1.0, "{:.2f}"),
    ("tokens/s (completions / step time)", "e2e_tokens_per_s", 1.0, "{:.0f}"),
    ("generation tokens/s", "gen_tokens_per_s", 1.0, "{:.0f}"),
    ("peak GPU memory (GiB)", "peak_gpu_gib", 1.0, "{:.2f}"),
    ("update MFU (% of measured bf16 peak)", "train_peak_fraction", 100.0, "{:.1f}"),
)


def measure_bf16_peak(device: str, n: int) -> float:
    """FLOP/s of an ``n``-cube bf16 matmul on ``device`` (median of 10 after 3 warm-ups), on
    random data (zeros run faster than real data)."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    times = []
    for i in range(13):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - t)
    return 2 * n**3 / sorted(times)[len(times) // 2]


def build_shape(name: str, folder: Path, tokenizer, device: str) -> Path:
    """A random-weight model of ``shapes/NAME.json`` saved (bf16) with the tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in json.loads((SHAPES / f"{name}.json").read_text()).items()}
    fields = {k: v for k, v in fields.items() if not k.startswith("_")}
    if fields["vocab_size"] >= len(tokenizer):
        raise ValueError(f"{name}: the tokenizer's EOS must lie beyond vocab_size")
    config = AutoConfig.for_model(
        fields.pop("model_type"),
        **fields,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return folder


def side_spec(
    shape: str,
    model_dir: Path,
    tokenizer,
    device: str,
    *,
    prompts: int,
    group: int,
    new_tokens: int,
    micro: int,
    steps: int,
    warmup: int = 1,
) -> dict:
    """A worker's spec for ``shape`` (``side``, ``work_dir`` and ``padded`` are the caller's)."""
    w = Workload(shape, "random", prompts, group, new_tokens, steps, warmup, steps, 1e-6, micro)
    spec = w.worker_spec(model_dir, seed=0, threads=2 if device == "cpu" else 8, steps=steps)
    spec.update(device=device, schedule=step_schedule(w, steps, tokenizer, seed=0))
    return spec


def trl_missing(python: str) -> str | None:
    """Why TRL's side cannot run under ``python`` (None when it can)."""
    res = subprocess.run([python, "-c", "import trl, datasets"], capture_output=True, text=True)
    return None if res.returncode == 0 else res.stderr.strip().splitlines()[-1]


class SideFailed(RuntimeError):
    """A side's worker failed or ran out of time; ``tail`` is the end of its log."""

    def __init__(self, message: str, tail: str):
        super().__init__(message)
        self.tail = tail


def worker_env() -> dict:
    """The workers' environment: the repository and its ``src`` first, then the caller's own
    ``PYTHONPATH`` (where run.sh put the carried wheels), kept."""
    paths = [str(ROOT), str(ROOT / "src")]
    paths += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "TOKENIZERS_PARALLELISM": "false"}


def run_side(kind: str, side: str, spec: dict, work: Path, python: str, timeout: float) -> dict:
    spec_path, result_path = work / f"{side}-spec.json", work / f"{side}-result.json"
    spec_path.write_text(json.dumps(spec))
    result_path.unlink(missing_ok=True)
    cmd = [python, "-m", "benchmarks.gpu.worker", kind, str(spec_path), str(result_path)]
    log_path = work / f"{side}.log"
    t = time.perf_counter()
    with open(log_path, "w") as log:
        try:
            res = subprocess.run(
                cmd,
                cwd=ROOT,
                env=worker_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise SideFailed(
                f"the {side} worker ran out of time ({timeout:.0f} s)", log_path.read_text()[-3000:]
            ) from None
    if res.returncode != 0:
        raise SideFailed(
            f"the {side} worker failed (exit {res.returncode})", log_path.read_text()[-3000:]
        )
    out = json.loads(result_path.read_text())
    out["process_s"] = time.perf_counter() - t
    return out


def summarize(result: dict, warmup: int, peak: float) -> dict:
    info = result["info"]
    s = summarize_side(result["records"], warmup, info, peak)
    measured = result["records"][warmup:]
    peaks = [r["peak_gpu_mb"] for r in measured if "peak_gpu_mb" in r]
    s["peak_gpu_gib"] = max(peaks) / 1024 if peaks else None
    s["maxrss_mb"] = result["maxrss_mb"]
    s["process_s"] = result["process_s"]
    s["attention"] = info.get("attention")
    # read from the side's model (harness.model_info.checkpointing); equal work: False
    s["activation_checkpointing"] = info.get("activation_checkpointing")
    s["versions"] = info.get("versions", {})
    s["prompt_digests"] = [r["prompt_digest"] for r in result["records"]]
    s["completion_lens"] = sorted({n for r in result["records"] for n in r["completion_lens"]})
    return s


def figure(summary: dict, key) -> float | None:
    if isinstance(key, tuple):
        return summary.get(key[0], {}).get(key[1])
    return summary.get(key)


def cell(value: float | None, scale: float, fmt: str) -> str:
    return fmt.format(value * scale) if value is not None else "-"


def table(shape: str, entry: dict) -> str:
    """One shape's markdown table: a figure per row, rlvr's and TRL's columns and their ratio;
    a side that did not run is a line under it saying why."""
    sides = entry["sides"]
    ran = {k: v for k, v in sides.items() if "failed" not in v}
    lines = [f"### {shape}", "", "| figure | rlvr | TRL | rlvr / TRL |", "|---|---|---|---|"]
    for label, key, scale, fmt in ROWS:
        ours = figure(ran["rlvr"], key) if "rlvr" in ran else None
        peer = figure(ran["trl"], key) if "trl" in ran else None
        ratio = safe_ratio(ours, peer)
        lines.append(
            f"| {label} | {cell(ours, scale, fmt)} | {cell(peer, scale, fmt)} | "
            f"{'-' if ratio is None else f'{ratio:.2f}'} |"
        )
    notes = [
        f"**{side}: {v['failed']}** (its log's tail is in the JSON)"
        for side, v in sides.items()
        if "failed" in v
    ]
    notes += entry.get("notes", [])
    if PADDED in ran and "rlvr" in ran:
        pad, packed = ran[PADDED], ran["rlvr"]
        notes.append(
            f"rlvr's update with replies packed (attention `{packed['attention']}`): "
            f"{packed['phase_median_s']['update']:.2f} s; padded (transformers' SDPA): "
            f"{pad['phase_median_s']['update']:.2f} s (steps {packed['step_time_median_s']:.2f} "
            f"s and {pad['step_time_median_s']:.2f} s)."
        )
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def render(report: dict) -> str:
    w = report["workload"]
    md = [
        f"# GPU benchmark: rlvr vs TRL GRPOTrainer, {report['date']}",
        "",
        f"Card: {report['device']}; bf16 matmul peak measured "
        f"{report['bf16_peak_flops'] / 1e12:.1f} TFLOP/s. {w['prompts_per_step']} prompts x "
        f"{w['group_size']} replies of exactly {w['reply_tokens']} tokens per step, micro-batches "
        f"of {w['micro_batch']}, {w['steps']} steps per side ({w['warmup']} warm-up left out). "
        f"{w['objective']}.",
        "",
    ]
    md += [f"- {n}" for n in report["notes"]] + ([""] if report["notes"] else [])
    md += [table(shape, entry) for shape, entry in report["shapes"].items()]
    md.append("Ratios below 1 are better for times and memory, above 1 for tokens/s and MFU.")
    return "\n".join(md) + "\n"


def write(report: dict, folders: list[Path], stem: str) -> None:
    """The JSON and the tables as they stand (after every side)."""
    text = render(report)
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{stem}.json").write_text(json.dumps(report, indent=1))
        (folder / f"{stem}.md").write_text(text)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="tables and JSON go here")
    p.add_argument("--dry", action="store_true", help="CPU, tiny shape, a few tokens (CI)")
    p.add_argument("--shapes", default=None, help=f"default {','.join(GPU_SHAPES)}; dry: tiny")
    p.add_argument("--steps", type=int, default=None, help="per side (default 4; dry 2)")
    p.add_argument("--warmup", type=int, default=1, help="first steps left out of the figures")
    p.add_argument("--prompts", type=int, default=None, help="prompts per step (default 8; dry 2)")
    p.add_argument("--group", type=int, default=None, help="replies per prompt (default 8; dry 2)")
    p.add_argument("--new-tokens", type=int, default=None, help="reply length (default 128; dry 8)")
    p.add_argument("--micro-batch", type=int, default=None, help="sequences per pass (16; dry 2)")
    p.add_argument("--sides", default="rlvr,trl", help=f"any of rlvr, trl, {PADDED}")
    p.add_argument("--trl-python", default=sys.executable, help="Python that runs TRL's side")
    p.add_argument("--results", type=Path, default=None, help="also write the files here")
    p.add_argument("--timeout", type=float, default=240, help="seconds per side and shape")
    p.add_argument(
        "--deadline", type=float, default=None, help="epoch seconds the last side ends by"
    )
    p.add_argument(
        "--stem", default=None, help="file name stem (default gpu-DATE, dry gpu-DATE-dry)"
    )
    p.add_argument("--work", type=Path, default=None, help="models, specs and worker logs")
    p.add_argument("--append", action="store_true", help="add to the --stem files in --out")
    a = p.parse_args(argv)
    unknown = [x for x in a.sides.split(",") if x not in ("rlvr", "trl", PADDED)]
    if unknown or "rlvr" not in a.sides.split(","):
        p.error(f"--sides={a.sides}: rlvr plus any of trl, {PADDED} (unknown: {unknown})")
    return a


def _exit_on_term(signum, frame) -> None:
    # SIGTERM (run.sh's `timeout`) as an exception: subprocess.run then kills the side's worker,
    # which would otherwise hold the GPU through the stages after this one
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_term)
    dry = a.dry
    device = "cpu" if dry else "cuda"
    if not dry and not torch.cuda.is_available():
        print("[gpu-bench] no CUDA device: run on a GPU, or --dry for the CPU dry mode")
        return 2
    shapes = (a.shapes or ("tiny" if dry else ",".join(GPU_SHAPES))).split(",")
    steps = a.steps or (2 if dry else 4)
    prompts, group = a.prompts or (2 if dry else 8), a.group or (2 if dry else 8)
    new_tokens, micro = a.new_tokens or (8 if dry else 128), a.micro_batch or (2 if dry else 16)
    sides = a.sides.split(",")
    min_side = MIN_SIDE_S_DRY if dry else MIN_SIDE_S
    a.out.mkdir(parents=True, exist_ok=True)
    # a fresh folder by default: an earlier run's run directories would stop rlvr's Trainer
    work = a.work or (a.out / "work" if dry else Path(tempfile.mkdtemp(prefix="rlvr-gpu-bench-")))
    work.mkdir(parents=True, exist_ok=True)
    import transformers

    from rlvr.training.tiny import build_fixed_length_tokenizer

    card = torch.cuda.get_device_name(0) if not dry else "cpu (dry mode)"
    stem = a.stem or f"gpu-{dt.date.today().isoformat()}" + ("-dry" if dry else "")
    folders = [a.out] + ([a.results] if a.results else [])
    earlier = a.out / f"{stem}.json"
    if a.append and earlier.exists():
        report = json.loads(earlier.read_text())
        peak = report["bf16_peak_flops"]
    else:
        peak = measure_bf16_peak(device, 512 if dry else 8192)
        report = {
            "date": dt.date.today().isoformat(),
            "device": card,
            "dry": dry,
            "bf16_peak_flops": peak,
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
            "workload": {
                "prompts_per_step": prompts,
                "group_size": group,
                "reply_tokens": new_tokens,
                "micro_batch": micro,
                "steps": steps,
                "warmup": warmup_steps(a.warmup, steps),
                "objective": "drgrpo, beta 0, fp32 weights + bf16 autocast, no gradient "
                "checkpointing, transformers generation",
            },
            "shapes": {},
            "notes": [],
        }
    print(f"[gpu-bench] {card}: measured bf16 matmul peak {peak / 1e12:.1f} TFLOP/s", flush=True)
    warmup = warmup_steps(a.warmup, steps)
    if "trl" in sides:
        why = trl_missing(a.trl_python)
        if why:
            note = f"TRL's side skipped: TRL is not installed for {a.trl_python} ({why})."
            print(f"[gpu-bench] {note}", flush=True)
            if note not in report["notes"]:
                report["notes"].append(note)
            sides = [s for s in sides if s != "trl"]
    tokenizers: dict = {}
    failed = 0
    for shape in shapes:
        entry: dict = {"sides": {}, "ratios_rlvr_over_trl": {}, "notes": []}
        report["shapes"][shape] = entry
        vocab = json.loads((SHAPES / f"{shape}.json").read_text())["vocab_size"]
        if vocab not in tokenizers:
            tokenizers[vocab] = build_fixed_length_tokenizer(vocab)
        tok = tokenizers[vocab]
        t = time.perf_counter()
        model_dir = build_shape(shape, work / shape / "model", tok, device)
        print(f"[gpu-bench] {shape}: model built in {time.perf_counter() - t:.1f}s", flush=True)
        spec = side_spec(
            shape,
            model_dir,
            tok,
            device,
            prompts=prompts,
            group=group,
            new_tokens=new_tokens,
            micro=micro,
            steps=steps,
            warmup=warmup,
        )
        for side in sides:
            left = a.timeout if a.deadline is None else min(a.timeout, a.deadline - time.time())
            if left < min_side:
                entry["sides"][side] = {
                    "failed": f"not run: {max(left, 0):.0f} s left before the deadline",
                    "log_tail": "",
                }
                failed += 1
                write(report, folders, stem)
                print(f"[gpu-bench] {shape} {side}: {entry['sides'][side]['failed']}", flush=True)
                continue
            spec.update(side=side, work_dir=str(work / shape / side), padded=side == PADDED)
            python = a.trl_python if side == "trl" else sys.executable
            kind = "trl" if side == "trl" else "rlvr"
            try:
                result = run_side(kind, side, spec, work / shape, python, left)
            except SideFailed as exc:
                entry["sides"][side] = {"failed": str(exc), "log_tail": exc.tail}
                failed += 1
                said = f"{exc}, tables written\n{exc.tail[-1500:]}"
            else:
                s = entry["sides"][side] = summarize(result, warmup, peak)
                said = (
                    f"step {s['step_time_median_s']:.2f}s, process {s['process_s']:.0f}s, "
                    "tables written"
                )
            ran = {k: v for k, v in entry["sides"].items() if "failed" not in v}
            entry["notes"] = equal_work_problems(ran, new_tokens)
            entry["ratios_rlvr_over_trl"] = {
                key if isinstance(key, str) else key[1]: safe_ratio(
                    figure(ran.get("rlvr", {}), key), figure(ran.get("trl", {}), key)
                )
                for _, key, _, _ in ROWS
            }
            write(report, folders, stem)
            print(f"[gpu-bench] {shape} {side}: {said}", flush=True)
    print(render(report), flush=True)
    return 1 if failed else 0


def warmup_steps(warmup: int, steps: int) -> int:
    if not 0 <= warmup < steps:
        raise ValueError(f"--warmup={warmup}: must be >= 0 and below --steps={steps}")
    return warmup


def equal_work_problems(summaries: dict, new_tokens: int) -> list[str]:
    """What breaks equal work among the sides that ran (none: an empty list): a reply not
    exactly ``new_tokens`` long, or TRL trained on other prompts than rlvr."""
    out = [
        f"not equal work: {side}'s reply lengths {s['completion_lens']}, not all {new_tokens}"
        for side, s in summaries.items()
        if s["completion_lens"] != [new_tokens]
    ]
    if (
        "trl" in summaries
        and "rlvr" in summaries
        and summaries["trl"]["prompt_digests"] != summaries["rlvr"]["prompt_digests"]
    ):
        out.append("not equal work: the two sides trained on different prompts (digests differ)")
    return out


if __name__ == "__main__":
    sys.exit(main())
