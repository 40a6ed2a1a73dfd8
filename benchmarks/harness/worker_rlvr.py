"""The rlvr side of a benchmark: ``python -m benchmarks.harness.worker_rlvr SPEC.json`` (rlvr's venv).

It runs the real trainer (``Trainer(cfg).fit()``) and only wraps ``train_step`` so that the
runner decides when each block of steps runs (see ``protocol.Gate``) and gets one record per step.
The spec's ``engine`` picks the rollout engine: ``hf`` (transformers, side ``rlvr``, in ``.venv``)
or ``vllm`` (side ``rlvr-vllm``, run by the Python of ``.venv-vllm``).
"""

from __future__ import annotations

import contextlib
import json
import resource
import sys
import time
from pathlib import Path

import psutil
import torch

from benchmarks.harness.model_info import checkpointing, param_counts
from benchmarks.harness.protocol import Gate
from benchmarks.harness.workloads import prompt_digest
from rlvr.allocator import describe as describe_allocator


class BenchStop(Exception):
    """Raised out of the wrapped step when the runner says stop (before the final save)."""


ENGINES = ("hf", "vllm")
# the spec's precision (benchmarks.harness.machine.bench_precision) as rlvr's model.autocast
AUTOCAST = {"bf16": "bf16", "float32": "off"}


def config_overrides(spec: dict) -> list[str]:
    """rlvr's config for the workload: Dr.GRPO, beta 0, one update per batch, no gradient
    checkpointing, and ``spec["precision"]`` (default bf16: bf16 autocast; float32: none).

    ``spec["engine"]`` (default ``hf``) is the rollout engine; vLLM keeps its config defaults
    (weights pushed to it after every update, timed as the step's ``sync`` phase).
    """
    engine = spec.get("engine", "hf")
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r}: known: {', '.join(ENGINES)}")
    precision = spec.get("precision", "bf16")
    if precision not in AUTOCAST:
        raise ValueError(f"precision={precision!r}: known: {', '.join(AUTOCAST)}")
    return [
        f"model.name_or_path={spec['model_dir']}",
        "model.dtype=float32",
        # equal work with TRL's side (worker_trl.grpo_args): no recomputed forward in the update
        "model.gradient_checkpointing=false",
        # float32 master weights; bf16 autocast, or float32 throughout (vLLM follows)
        f"model.autocast={AUTOCAST[precision]}",
        "data.task=arithmetic",
        "data.template=chat",
        "algo.objective=drgrpo",
        "algo.beta=0",
        "algo.epochs_per_batch=1",
        "algo.minibatches=1",
        f"algo.group_size={spec['group_size']}",
        f"algo.prompts_per_step={spec['prompts_per_step']}",
        f"algo.micro_batch_size={spec['micro_batch']}",
        f"rollout.engine={engine}",
        "rollout.temperature=1.0",
        "rollout.top_p=1.0",
        "rollout.top_k=0",
        f"rollout.max_new_tokens={spec['max_new_tokens']}",
        f"train.lr={spec['lr']}",
        "train.schedule=constant",
        "train.warmup_steps=0",
        f"train.max_steps={spec['steps']}",
        f"train.seed={spec['seed']}",
        f"train.threads={spec['threads']}",
        "train.preflight_step=0",
        "eval.before_after=false",
        "logging.samples_every=0",
        "logging.progress=false",
        # A tiny random model never earns a reward; the benchmark must not stop on that.
        "health.reward_stuck.action=warn",
        "health.grad_norm_zero.action=warn",
    ]


def step_record(trainer, metrics: dict) -> dict:
    batch = trainer.last_batch
    prompt_texts, groups, comps = batch.prompt_texts, batch.groups, batch.completions
    prompt_lens = [len(ids) for ids in batch.prompt_ids]
    return {
        "phases": {
            "generate": metrics["time_rollout"],
            "reward": metrics["time_reward"],
            # the trainer's own log-probs of the samples and the reference's
            "logprob": metrics["time_logprobs"] + metrics["time_reference"],
            "update": metrics["time_update"],
            "sync": metrics["time_sync"],
        },
        "completion_tokens": sum(len(c.token_ids) for c in comps),
        "prompt_tokens": sum(n * len(g) for n, g in zip(prompt_lens, groups, strict=True)),
        "prompt_lens": prompt_lens,
        # one entry per sequence: what the generation bound (bounds.py) reads
        "seq_prompt_lens": [n for n, g in zip(prompt_lens, groups, strict=True) for _ in g],
        "completion_lens": [len(c.token_ids) for c in comps],
        "sequences": len(comps),
        "reward_mean": metrics["reward_mean"],
        "prompt_digest": prompt_digest(prompt_texts),
        "inner_step_s": metrics["time_step"],
        # the seed the step's generation drew from (Step.seed: train.seed and the step counter)
        "torch_seed": torch.initial_seed(),
    }


def fit_gated(trainer, gate, side: str, **info) -> None:
    """``trainer.fit()`` (rlvr's own loop: its step counter, seeds, health gate and metrics)
    with every ``train_step`` reported to ``gate`` (``protocol.Gate``, or the GPU worker's
    ``Recorder``); stops, before the final save, when the gate says so. ``info`` joins the
    ``ready`` event."""
    inner = trainer.train_step
    started = False

    def gated_step() -> dict:
        nonlocal started
        if not started:
            started = True
            startup = time.time() - psutil.Process().create_time()
            import transformers

            versions = {"torch": torch.__version__, "transformers": transformers.__version__}
            if trainer.engine.name == "vllm":
                import vllm

                versions["vllm"] = vllm.__version__
            ready = gate.start(
                side=side,
                engine=trainer.engine.name,
                startup_s=startup,
                allocator=describe_allocator(),
                threads=torch.get_num_threads(),
                versions=versions,
                activation_checkpointing=checkpointing(trainer.model),
                **param_counts(trainer.model),
                **info,
            )
            if not ready:
                raise BenchStop
        metrics = inner()
        if not gate.step_done(step_record(trainer, metrics)):
            raise BenchStop
        return metrics

    trainer.train_step = gated_step
    with contextlib.suppress(BenchStop):  # the runner's stop, raised out of a step
        trainer.fit()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m benchmarks.harness.worker_rlvr SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    from rlvr.config import load_config
    from rlvr.training.trainer import Trainer

    torch.set_num_threads(spec["threads"])
    cfg = load_config(None, config_overrides(spec))
    trainer = Trainer(cfg, run_dir=Path(spec["work_dir"]) / "rlvr-run")
    gate = Gate()
    side = spec.get("side", "rlvr")
    fit_gated(trainer, gate, side)
    self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    gate.emit("done", side=side, maxrss_self_mb=self_kb / 1024)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
