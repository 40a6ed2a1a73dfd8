"""The benchmark workloads and the exact prompts each step of a run sees (same on both sides).

Both sides draw prompts from the built-in arithmetic task in the order rlvr's ``PromptSampler``
gives them; TRL gets that order as its dataset with shuffling off. Each worker reports a digest of
the prompts it trained on per step, and the runner checks the two sides agree.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass

# The arithmetic task as rlvr's config defaults build it (data.num_train / num_eval / seed).
TASK = "arithmetic"
NUM_TRAIN = 2000
NUM_EVAL = 100
DATA_SEED = 0


@dataclass(frozen=True)
class Workload:
    """One benchmark setting; both sides run exactly these numbers."""

    name: str
    model: str  # "default" (SmolLM2-135M-Instruct folder) or "tiny" (save_tiny_model)
    prompts_per_step: int
    group_size: int
    max_new_tokens: int
    steps: int  # default number of steps per side
    warmup: int  # first steps left out of the step-time figures
    block: int  # steps one side runs before the other side takes its turn
    lr: float = 2e-5
    micro_batch: int = 8  # sequences per forward/backward pass on both sides
    target_reward: float | None = None  # "time to target" workloads stop each side once reached
    target_window: int = 3
    # seeds run when neither --seed nor --seeds is given: time to target is a distribution
    seeds: tuple[int, ...] = (0,)

    @property
    def sequences(self) -> int:
        """Completions per step: prompts_per_step x group_size."""
        return self.prompts_per_step * self.group_size

    def to_dict(self) -> dict:
        return asdict(self)

    def worker_spec(
        self, model_dir, *, seed: int, threads: int, steps: int, precision: str = "bf16"
    ) -> dict:
        """The settings a worker trains with (``worker_rlvr.config_overrides``,
        ``worker_trl.grpo_args``): this workload's numbers plus the run's own."""
        return {
            "model_dir": str(model_dir),
            "prompts_per_step": self.prompts_per_step,
            "group_size": self.group_size,
            "max_new_tokens": self.max_new_tokens,
            "micro_batch": self.micro_batch,
            "lr": self.lr,
            "steps": steps,
            "seed": seed,
            "threads": threads,
            "precision": precision,
        }


WORKLOADS: dict[str, Workload] = {
    "quick": Workload("quick", "tiny", 2, 4, 16, steps=6, warmup=1, block=2),
    "default": Workload("default", "default", 2, 8, 64, steps=10, warmup=2, block=2),
    "long": Workload("long", "default", 2, 16, 128, steps=8, warmup=2, block=2),
    "target": Workload(
        "target",
        "default",
        4,
        8,
        48,
        steps=40,
        warmup=2,
        block=3,
        target_reward=0.9,
        seeds=(0, 1, 2, 3, 4),
    ),
}


def get_workload(name: str) -> Workload:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    return WORKLOADS[name]


def check_workload(w: Workload, steps: int) -> None:
    """Raise ValueError naming the bad field when a workload cannot run on both sides."""
    if steps < 1:
        raise ValueError(f"--steps={steps}: must be >= 1")
    if w.group_size < 2:
        raise ValueError(f"workload {w.name}: group_size={w.group_size} must be >= 2")
    # TRL trains on micro-batches of micro_batch sequences with gradient accumulation over the
    # whole rollout batch, so the batch must split evenly (rlvr regroups sequences by length and
    # has no such rule).
    if w.sequences % w.micro_batch:
        raise ValueError(
            f"workload {w.name}: micro_batch={w.micro_batch} must divide "
            f"prompts_per_step x group_size = {w.sequences}"
        )


def prompt_digest(texts: list[str]) -> str:
    """Short digest of one step's prompt texts (one per prompt, in order)."""
    h = hashlib.sha1()
    for t in texts:
        h.update(t.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def step_schedule(w: Workload, steps: int, tokenizer, seed: int) -> list[list[dict]]:
    """The prompts of each step, as rlvr's trainer will draw them.

    Returns ``steps`` lists of ``prompts_per_step`` dicts ``{"prompt": chat text, "answer": str}``.
    Needs rlvr (the runner's environment), not TRL.
    """
    from rlvr.data.tasks import task_rows
    from rlvr.data.templates import render_prompt
    from rlvr.training.batching import PromptSampler

    rows, _ = task_rows(TASK, num_train=NUM_TRAIN, num_eval=NUM_EVAL, seed=DATA_SEED)
    sampler = PromptSampler(len(rows), w.prompts_per_step, seed=seed)
    out = []
    for _ in range(steps):
        picked = [rows[i] for i in sampler.next_indices()]
        out.append(
            [
                {"prompt": render_prompt("chat", r["prompt"], tokenizer), "answer": r["answer"]}
                for r in picked
            ]
        )
    return out
