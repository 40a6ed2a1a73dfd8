"""rollout.mode=server figures: idle time of the trainer and of the rollout worker per step, and
weight-sync cost per MB, for rollout.max_staleness 0 and 1.

    python -m benchmarks.studies.rollout_server                       # from .venv-vllm; tiny + 27M model
    python -m benchmarks.studies.rollout_server --sizes 128x2 --steps 4

Each run is ``rlvr train`` in this process with ``rollout.mode=server`` (it starts the vLLM server
as a child process, float32, on a random tiny Llama model of the given ``hidden x layers``).
Per step, from metrics.jsonl:

- trainer idle = time_rollout (waiting for the batch) + time_wait_ahead (waiting for the batch
  generated ahead before a sync);
- worker busy = time_generate (its generation of the batch) + sync_seconds (receiving weights);
  worker idle = time_step - worker busy (one worker, one trainer);
- sync ms per MB = sync_seconds / sync_bytes (MiB).

``--summarize RUN_DIR ...`` tabulates finished (or cut short) runs without running anything.

Step 1 is left out of the means (start-up, no batch ahead yet). Needs vLLM (``make setup-vllm``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from benchmarks.harness.machine import load_average


def run(size: str, staleness: int, steps: int, out: Path) -> dict:
    import torch

    from rlvr.config import load_config
    from rlvr.rollout.server import free_port
    from rlvr.training.tiny import save_tiny_model
    from rlvr.training.trainer import Trainer

    hidden, layers = (int(x) for x in size.split("x"))
    model = out / f"model-{size}"
    if not model.exists():
        save_tiny_model(
            model,
            hidden=hidden,
            heads=hidden // 64,
            kv_heads=hidden // 64,
            layers=layers,
            intermediate=3 * hidden,
        )
    cfg = load_config(
        None,
        [
            f"model.name_or_path={model}",
            f"train.output_dir={out}",
            f"train.run_name={size}-s{staleness}",
            f"train.max_steps={steps}",
            "train.lr=1e-3",
            "model.autocast=off",
            "data.template=none",
            "data.max_prompt_tokens=32",
            "rollout.engine=vllm",
            "rollout.mode=server",
            f"rollout.server_port={free_port('127.0.0.1')}",
            f"rollout.max_staleness={staleness}",
            "rollout.max_new_tokens=32",
            "algo.prompts_per_step=4",
            "algo.group_size=8",
            "algo.tis_cap=2",
            "eval.before_after=false",
            "logging.progress=false",
        ],
    )
    torch.manual_seed(0)
    trainer = Trainer(cfg)
    trainer.fit()
    return summarize(trainer.run.run_dir)


def summarize(run_dir: Path) -> dict:
    """The figures of one finished (or cut short) run from its metrics.jsonl."""
    text = (Path(run_dir) / "metrics.jsonl").read_text()
    lines = [json.loads(x) for x in text.split("\n") if x]
    rows = [m for m in lines if m["step"] > 1]
    mean = lambda key: statistics.mean(key(m) for m in rows)  # noqa: E731
    # staleness 0 generates inside time_rollout; staleness 1 logs the generation time_generate
    gen = lambda m: m.get("time_generate", m["time_rollout"])  # noqa: E731
    trainer_idle = mean(lambda m: m["time_rollout"] + m.get("time_wait_ahead", 0.0))
    worker_busy = mean(lambda m: gen(m) + m.get("sync_seconds", 0.0))
    step = mean(lambda m: m["time_step"])
    mb = rows[0]["sync_bytes"] / 2**20
    return {
        "run": Path(run_dir).name,
        "steps": len(rows),
        "step_s": step,
        "trainer_idle_s": trainer_idle,
        "worker_idle_s": step - worker_busy,
        "generate_s": mean(gen),
        "logprobs_update_s": mean(lambda m: m["time_logprobs"] + m["time_update"]),
        "sync_mb": mb,
        "sync_s": mean(lambda m: m["sync_seconds"]),
        "sync_ms_per_mb": 1000 * mean(lambda m: m["sync_seconds"]) / mb,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="128x2,512x8", help="hidden x layers, comma-separated")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--out", default=None, help="folder for models and runs (default: a temp dir)")
    p.add_argument("--summarize", nargs="+", metavar="RUN_DIR", help="only tabulate these runs")
    args = p.parse_args()
    print(f"load average before: {load_average()}", flush=True)
    if args.summarize:
        results = [summarize(Path(d)) for d in args.summarize]
    else:
        out = Path(args.out or tempfile.mkdtemp(prefix="rlvr-server-bench-"))
        results = [
            run(size, staleness, args.steps, out)
            for size in args.sizes.split(",")
            for staleness in (0, 1)
        ]
    print(f"load average after: {load_average()}")
    cols = list(results[0])
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in results:
        print(
            "| "
            + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in r.values())
            + " |"
        )


if __name__ == "__main__":
    main()
