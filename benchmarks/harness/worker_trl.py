"""The TRL side of a benchmark: ``python -m benchmarks.harness.worker_trl SPEC.json`` (TRL's own venv).

TRL's ``GRPOTrainer`` runs unmodified; a subclass only times the methods the step is made of
(generation, reward, no-grad log-prob passes, the whole pre-update stage) and a callback hands
control to the runner between blocks of steps (see ``protocol.Gate``). Nothing installed is patched.

Needs ``PYTHONPATH`` with the repository root (for ``benchmarks``) and ``src`` (for rlvr's
maths grader, so both sides score completions with the same function).
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

import psutil

from benchmarks.harness.model_info import checkpointing, param_counts
from benchmarks.harness.protocol import Gate
from benchmarks.harness.workloads import prompt_digest
from rlvr.allocator import describe as describe_allocator


def arithmetic_reward(prompts, completions, answer, **kwargs) -> list[float]:
    """rlvr's maths reward (last number when no box) for TRL's reward-function interface."""
    from rlvr.rewards.math import grade

    return [grade(c, a).score for c, a in zip(completions, answer, strict=True)]


def grpo_args(spec: dict):
    """TRL's settings for the same algorithm: Dr.GRPO, beta 0, one update per batch, and the
    spec's precision (bf16 mixed precision by default, float32 with ``"precision": "float32"``).
    No gradient checkpointing unless the spec asks (``"gradient_checkpointing": true``): rlvr's
    update keeps its activations, and TRL's configs turn checkpointing on by default
    (``trl/trainer/base_config.py``), which would make TRL's update recompute each forward."""
    from trl import GRPOConfig

    seqs = spec["prompts_per_step"] * spec["group_size"]
    return GRPOConfig(
        output_dir=str(Path(spec["work_dir"]) / "trl-run"),
        use_cpu=spec.get("device", "cpu") == "cpu",  # the GPU benchmark's spec says cuda
        bf16=spec.get("precision", "bf16") == "bf16",  # float32 otherwise, as rlvr's side
        per_device_train_batch_size=spec["micro_batch"],
        # one optimizer step per rollout batch: accumulate over all its micro-batches
        gradient_accumulation_steps=seqs // spec["micro_batch"],
        num_generations=spec["group_size"],
        max_completion_length=spec["max_new_tokens"],
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        loss_type="dr_grpo",
        scale_rewards="none",
        num_iterations=1,
        epsilon=0.2,
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        max_grad_norm=1.0,
        max_steps=spec["steps"],
        seed=spec["seed"],
        shuffle_dataset=False,  # the dataset already is rlvr's prompt order
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        gradient_checkpointing=bool(spec.get("gradient_checkpointing", False)),
    )


def load_tokenizer_and_model(spec: dict):
    """The spec's thread count, its model's tokenizer (EOS pads, left padding) and its float32
    weights, as every TRL side loads them."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(spec["threads"])
    tok = AutoTokenizer.from_pretrained(spec["model_dir"])
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok, AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)


def build_trainer(spec: dict, gate: Gate):
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    class TimedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer with per-phase timers around its own methods (behaviour unchanged)."""

        def _bench_reset(self) -> None:
            self.bench = {"generate": 0.0, "reward": 0.0, "logprob": 0.0, "update": 0.0}
            self.bench_info: dict = {}
            self._bench_scoring = False
            self._bench_scored_at = None

        def _generate(self, prompts):
            t = time.perf_counter()
            out = super()._generate(prompts)
            self.bench["generate"] += time.perf_counter() - t
            prompt_ids, completion_ids = out[0], out[1]
            g = self.num_generations
            self.bench_info.update(
                prompt_tokens=sum(len(p) for p in prompt_ids),
                completion_tokens=sum(len(c) for c in completion_ids),
                sequences=len(completion_ids),
                prompt_lens=[len(p) for p in prompt_ids[::g]],
                seq_prompt_lens=[len(p) for p in prompt_ids],
                completion_lens=[len(c) for c in completion_ids],
            )
            return out

        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            t = time.perf_counter()
            out = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            self.bench["reward"] += time.perf_counter() - t
            self.bench_info["reward_mean"] = float(out[:, 0].float().mean())
            return out

        def _get_per_token_logps_and_entropies(self, *args, **kwargs):
            if not self._bench_scoring:  # the update's own forward pass
                return super()._get_per_token_logps_and_entropies(*args, **kwargs)
            t = time.perf_counter()
            out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
            self.bench["logprob"] += time.perf_counter() - t
            return out

        def _generate_and_score_completions(self, inputs):
            texts = [x["prompt"] for x in inputs]
            self.bench_info["prompt_digest"] = prompt_digest(texts[:: self.num_generations])
            self._bench_scoring = True
            try:
                return super()._generate_and_score_completions(inputs)
            finally:
                self._bench_scoring = False
                self._bench_scored_at = time.perf_counter()

    class GateCallback(TrainerCallback):
        def __init__(self):
            self.trainer = None

        def on_train_begin(self, args, state, control, **kwargs):
            torch.set_num_threads(spec["threads"])
            import accelerate
            import transformers
            import trl

            startup = time.time() - psutil.Process().create_time()
            ok = gate.start(
                side=spec.get("side", "trl"),
                startup_s=startup,
                allocator=describe_allocator(),
                threads=torch.get_num_threads(),
                versions={
                    "trl": trl.__version__,
                    "transformers": transformers.__version__,
                    "torch": torch.__version__,
                    "accelerate": accelerate.__version__,
                },
                activation_checkpointing=checkpointing(self.trainer.model),
                **param_counts(self.trainer.model),
            )
            self.trainer._bench_reset()
            if not ok:
                control.should_training_stop = True
            return control

        def on_optimizer_step(self, args, state, control, **kwargs):
            tr = self.trainer
            if tr._bench_scored_at is not None:  # forward/backward of every micro-batch + step
                if torch.cuda.is_available() and str(spec.get("device", "cpu")).startswith("cuda"):
                    # the optimizer step's kernels are still queued: the same clock as rlvr's
                    # time_update, which waits for them (training/step.py)
                    torch.cuda.synchronize()
                tr.bench["update"] = time.perf_counter() - tr._bench_scored_at
            return control

        def on_step_end(self, args, state, control, **kwargs):
            tr = self.trainer
            record = {"phases": dict(tr.bench), **tr.bench_info}
            record["phases"]["sync"] = 0.0  # transformers generation uses the trained module
            tr._bench_reset()
            if not gate.step_done(record):
                control.should_training_stop = True
            return control

    tok, model = load_tokenizer_and_model(spec)
    rows = [r for step in spec["schedule"] for r in step]
    callback = GateCallback()
    trainer = TimedGRPOTrainer(
        model=model,
        reward_funcs=[arithmetic_reward],
        args=grpo_args(spec),
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        callbacks=[callback],
    )
    callback.trainer = trainer
    trainer._bench_reset()
    return trainer


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m benchmarks.harness.worker_trl SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    gate = Gate()
    trainer = build_trainer(spec, gate)
    trainer.train()
    self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    gate.emit("done", side=spec.get("side", "trl"), maxrss_self_mb=self_kb / 1024)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
