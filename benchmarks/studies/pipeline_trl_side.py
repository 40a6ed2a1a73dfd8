"""TRL's side of ``benchmarks.studies.pipeline_vs_trl``: TRL's whole training loop, in TRL's venv.

    python -m benchmarks.studies.pipeline_trl_side DIR update   # replay rlvr's batches through GRPOTrainer.train
    python -m benchmarks.studies.pipeline_trl_side DIR sample   # GRPOTrainer.train at learning rate 0

``update``: ``GRPOTrainer.train()`` runs as many steps as ``DIR/batches.json`` holds, and TRL's own
``rollout_func`` hook hands it, for each prompt it asks about, the replies rlvr sampled for that
prompt at that step. Everything after sampling is TRL's: rewards, advantages, loss, gradient
accumulation, clipping, AdamW, the schedule. Saves the final weights (``trl_weights.pt``) and
each step's logged reward, gradient norm and learning rate (``trl_steps.json``).

``sample``: the same trainer with learning rate 0 samples ``spec["steps"]`` batches from the
unchanged model through TRL's own generation path; saves the prompt and reply ids of every
sequence (``trl_samples.json``). Nothing of TRL is patched (a subclass reads ``_generate``'s
result).
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict, deque
from collections.abc import Callable
from pathlib import Path


class RolloutReplay:
    """TRL's ``rollout_func``: serves step ``k``'s recorded replies on its ``k``-th call.

    ``batches``: per step ``{"prompt_ids": [...], "completion_ids": [...]}``, one entry per
    sequence; ``tokenize``: prompt text -> ids, as TRL tokenizes it. Each prompt gets its own
    recorded replies in their recorded order; a prompt that step did not sample, more calls than
    steps, or a reply left over raises (a silent mismatch would compare different batches).
    """

    def __init__(self, batches: list[dict], tokenize: Callable[[str], list[int]]):
        self.batches = batches
        self.tokenize = tokenize
        self.calls = 0

    def __call__(self, prompts: list[str], trainer=None) -> dict:
        if self.calls >= len(self.batches):
            raise RuntimeError(
                f"TRL asked for step {self.calls + 1}; rlvr recorded {len(self.batches)}"
            )
        batch = self.batches[self.calls]
        queues: dict[tuple, deque] = defaultdict(deque)
        for p, c in zip(batch["prompt_ids"], batch["completion_ids"], strict=True):
            queues[tuple(p)].append(c)
        prompt_ids = [self.tokenize(p) for p in prompts]
        completion_ids = []
        for text, ids in zip(prompts, prompt_ids, strict=True):
            if not queues[tuple(ids)]:
                raise RuntimeError(
                    f"step {self.calls + 1}: no recorded reply left for prompt {text[-60:]!r}"
                )
            completion_ids.append(queues[tuple(ids)].popleft())
        left = sum(len(q) for q in queues.values())
        if left:
            raise RuntimeError(f"step {self.calls + 1}: {left} recorded replies were not asked for")
        self.calls += 1
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}


def _trainer(spec: dict, out: Path, *, lr: float, rollout_func=None, trainer_cls=None):
    from datasets import Dataset
    from trl import GRPOTrainer

    from benchmarks.harness.worker_trl import arithmetic_reward, grpo_args, load_tokenizer_and_model

    tok, model = load_tokenizer_and_model(spec)
    rows = [r for step in spec["schedule"][: spec["steps"]] for r in step]
    cls = trainer_cls or GRPOTrainer
    trainer = cls(
        model=model,
        reward_funcs=[arithmetic_reward],
        args=grpo_args({**spec, "lr": lr, "work_dir": str(out / "trl-run")}),
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        rollout_func=rollout_func(tok) if rollout_func else None,
    )
    return trainer, model


def run_update(out: Path, spec: dict) -> None:
    import torch
    from transformers import TrainerCallback

    batches = json.loads((out / "batches.json").read_text())
    logged: list[dict] = []

    class Log(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "grad_norm" in logs:
                logged.append({k: float(logs[k]) for k in ("reward", "grad_norm", "learning_rate")})

    def replay(tok):
        return RolloutReplay(batches, lambda p: tok(p, add_special_tokens=False)["input_ids"])

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func's notice
    trainer, model = _trainer(
        {**spec, "steps": len(batches)}, out, lr=spec["lr"], rollout_func=replay
    )
    trainer.add_callback(Log())
    trainer.train()
    (out / "trl_steps.json").write_text(json.dumps(logged))
    torch.save(
        {k: v.detach().clone() for k, v in model.state_dict().items()}, out / "trl_weights.pt"
    )


def run_sample(out: Path, spec: dict) -> None:
    from trl import GRPOTrainer

    records: list[dict] = []

    class Recording(GRPOTrainer):
        def _generate(self, prompts):
            result = super()._generate(prompts)
            records.append({"prompt_ids": result[0], "completion_ids": result[1]})
            return result

    trainer, _ = _trainer(spec, out, lr=0.0, trainer_cls=Recording)
    trainer.train()
    (out / "trl_samples.json").write_text(json.dumps(records))


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in ("update", "sample"):
        print(
            "usage: python -m benchmarks.studies.pipeline_trl_side DIR update|sample",
            file=sys.stderr,
        )
        return 2
    out = Path(argv[0])
    spec = json.loads((out / "spec.json").read_text())
    (run_update if argv[1] == "update" else run_sample)(out, spec)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
