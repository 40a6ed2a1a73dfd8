"""rlvr against TRL's GRPOTrainer on one GPU at equal work (issue 47; docs/gpu.md).

``python -m benchmarks.gpu.bench --out DIR`` (run by ``run.sh`` on the device machine), or
``--dry`` for the CPU dry mode CI runs (tiny shape, a few tokens; the TRL side is skipped with a
line saying so where TRL is not installed).

Equal work: the same model shape (Qwen2.5 configs in ``shapes/``, random weights), the same
prompts in the same order (``harness/workloads.step_schedule``, checked by digest), group size,
Dr.GRPO with beta 0, fp32 weights under bf16 autocast, transformers generation on both sides, and
replies of exactly ``--new-tokens`` tokens: the tokenizer's EOS lies beyond the model's rows
(``rlvr.training.tiny.build_fixed_length_tokenizer``), so neither sampler can stop early. Each
side runs alone in its own process (``worker.py``). Figures over the steps after ``--warmup``:
step, generation and update time (medians), tokens/s, peak GPU memory
(``torch.cuda.max_memory_allocated``), update MFU against this card's measured bf16 matmul peak,
each with its rlvr/TRL ratio.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
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


def run_side(kind: str, side: str, spec: dict, work: Path, python: str, timeout: int) -> dict:
    spec_path, result_path = work / f"{side}-spec.json", work / f"{side}-result.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")])}
    env["TOKENIZERS_PARALLELISM"] = "false"
    cmd = [python, "-m", "benchmarks.gpu.worker", kind, str(spec_path), str(result_path)]
    t = time.perf_counter()
    with open(work / f"{side}.log", "w") as log:
        res = subprocess.run(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout
        )
    if res.returncode != 0:
        tail = (work / f"{side}.log").read_text()[-3000:]
        raise RuntimeError(f"the {side} worker failed (exit {res.returncode}):\n{tail}")
    out = json.loads(result_path.read_text())
    out["process_s"] = time.perf_counter() - t
    return out


def summarize(result: dict, warmup: int, peak: float) -> dict:
    info = result["info"]
    s = summarize_side(result["records"], warmup, info, peak)
    s["peak_gpu_gib"] = result["peak_gpu_mb"] / 1024 if "peak_gpu_mb" in result else None
    s["maxrss_mb"] = result["maxrss_mb"]
    s["process_s"] = result["process_s"]
    s["attention"] = info.get("attention")
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


def table(shape: str, sides: dict, note: str | None) -> str:
    lines = [f"### {shape}", "", "| figure | rlvr | TRL | rlvr / TRL |", "|---|---|---|---|"]
    for label, key, scale, fmt in ROWS:
        ours = figure(sides["rlvr"], key)
        peer = figure(sides["trl"], key) if "trl" in sides else None
        ratio = safe_ratio(ours, peer)
        lines.append(
            f"| {label} | {cell(ours, scale, fmt)} | {cell(peer, scale, fmt)} | {'-' if ratio is None else f'{ratio:.2f}'} |"
        )
    if note:
        lines += ["", note]
    return "\n".join(lines) + "\n"


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
    p.add_argument("--results", type=Path, default=None, help="also write gpu-DATE.{json,md} here")
    p.add_argument("--timeout", type=int, default=240, help="seconds per side and shape")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
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
    a.out.mkdir(parents=True, exist_ok=True)
    work = a.out / "work" if dry else Path(os.environ.get("TMPDIR", "/tmp")) / "rlvr-gpu-bench"
    work.mkdir(parents=True, exist_ok=True)
    import transformers

    from rlvr.training.tiny import build_fixed_length_tokenizer

    card = torch.cuda.get_device_name(0) if not dry else "cpu (dry mode)"
    peak = measure_bf16_peak(device, 512 if dry else 8192)
    print(f"[gpu-bench] {card}: measured bf16 matmul peak {peak / 1e12:.1f} TFLOP/s", flush=True)
    note = None
    if "trl" in sides:
        why = trl_missing(a.trl_python)
        if why:
            note = f"TRL's side skipped: TRL is not installed for {a.trl_python} ({why})."
            print(f"[gpu-bench] {note}", flush=True)
            sides = [s for s in sides if s != "trl"]
    report: dict = {
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
            "objective": "drgrpo, beta 0, fp32 weights + bf16 autocast, transformers generation",
        },
        "shapes": {},
        "notes": [note] if note else [],
    }
    md = [
        f"# GPU benchmark: rlvr vs TRL GRPOTrainer, {report['date']}",
        "",
        f"Card: {card}; bf16 "
        f"matmul peak measured {peak / 1e12:.1f} TFLOP/s. {prompts} prompts x {group} replies of "
        f"exactly {new_tokens} tokens per step, micro-batches of {micro}, {steps} steps per side "
        f"({report['workload']['warmup']} warm-up left out). {report['workload']['objective']}.",
        "",
    ]
    tokenizers: dict = {}
    for shape in shapes:
        vocab = json.loads((SHAPES / f"{shape}.json").read_text())["vocab_size"]
        if vocab not in tokenizers:
            tokenizers[vocab] = build_fixed_length_tokenizer(vocab)
        tok = tokenizers[vocab]
        t = time.perf_counter()
        model_dir = build_shape(shape, work / shape / "model", tok, device)
        print(f"[gpu-bench] {shape}: model built in {time.perf_counter() - t:.1f}s", flush=True)
        w = Workload(
            shape, "random", prompts, group, new_tokens, steps, a.warmup, steps, 1e-6, micro
        )
        spec = w.worker_spec(model_dir, seed=0, threads=2 if dry else 8, steps=steps)
        spec.update(device=device, schedule=step_schedule(w, steps, tok, seed=0))
        summaries = {}
        for side in sides:
            spec.update(side=side, work_dir=str(work / shape / side), padded=side == PADDED)
            python = a.trl_python if side == "trl" else sys.executable
            kind = "trl" if side == "trl" else "rlvr"
            result = run_side(kind, side, spec, work / shape, python, a.timeout)
            summaries[side] = summarize(result, report["workload"]["warmup"], peak)
            s = summaries[side]
            print(
                f"[gpu-bench] {shape} {side}: step {s['step_time_median_s']:.2f}s, "
                f"process {s['process_s']:.0f}s",
                flush=True,
            )
        check_equal_work(summaries, new_tokens)
        ratios = {
            key if isinstance(key, str) else key[1]: safe_ratio(
                figure(summaries["rlvr"], key), figure(summaries.get("trl", {}), key)
            )
            for _, key, _, _ in ROWS
        }
        report["shapes"][shape] = {"sides": summaries, "ratios_rlvr_over_trl": ratios}
        md.append(table(shape, summaries, note))
        if PADDED in summaries:
            pad, packed = summaries[PADDED], summaries["rlvr"]
            md.append(
                f"rlvr's update with replies packed (attention `{packed['attention']}`): "
                f"{packed['phase_median_s']['update']:.2f} s; padded (transformers' SDPA): "
                f"{pad['phase_median_s']['update']:.2f} s (steps {packed['step_time_median_s']:.2f} "
                f"s and {pad['step_time_median_s']:.2f} s).\n"
            )
    md.append("Ratios below 1 are better for times and memory, above 1 for tokens/s and MFU.")
    text = "\n".join(md) + "\n"
    stem = f"gpu-{report['date']}" + ("-dry" if dry else "")
    for folder in [a.out] + ([a.results] if a.results else []):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{stem}.json").write_text(json.dumps(report, indent=1))
        (folder / f"{stem}.md").write_text(text)
    print(text, flush=True)
    return 0


def warmup_steps(warmup: int, steps: int) -> int:
    if not 0 <= warmup < steps:
        raise ValueError(f"--warmup={warmup}: must be >= 0 and below --steps={steps}")
    return warmup


def check_equal_work(summaries: dict, new_tokens: int) -> None:
    """Both sides trained on the same prompts, every reply exactly ``new_tokens`` long."""
    for side, s in summaries.items():
        if s["completion_lens"] != [new_tokens]:
            raise RuntimeError(
                f"{side}: reply lengths {s['completion_lens']}, not all {new_tokens}"
            )
    if (
        "trl" in summaries
        and summaries["trl"]["prompt_digests"] != summaries["rlvr"]["prompt_digests"]
    ):
        raise RuntimeError("the two sides trained on different prompts (digests differ)")


if __name__ == "__main__":
    sys.exit(main())
