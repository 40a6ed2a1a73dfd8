"""The rows a config names (a built-in task or files) and the reward specs that grade them."""

from __future__ import annotations

from rlvr.config import Config
from rlvr.data.loaders import load_rows
from rlvr.data.tasks import default_reward, task_rows
from rlvr.rewards.runner import RewardSpec


def load_rows_for(cfg: Config) -> tuple[list[dict], list[dict]]:
    """Train and held-out rows: generated for a built-in task, read from files otherwise."""
    d = cfg.data
    if d.task != "file":
        return task_rows(
            d.task, num_train=d.num_train, num_eval=d.num_eval, seed=d.seed, **d.task_kwargs
        )

    kw = dict(
        prompt_field=d.prompt_field,
        answer_field=d.answer_field,
        system_prompt=d.system_prompt,
        answer_extract=d.answer_extract,
    )
    train = load_rows(d.train_path, **kw)
    evals = load_rows(d.eval_path, **kw)[: cfg.eval.max_problems] if d.eval_path else []
    return train, evals


def reward_specs(cfg: Config) -> list[RewardSpec]:
    if cfg.reward.specs:
        return list(cfg.reward.specs)
    return [RewardSpec(name=default_reward(cfg.data.task))]


def reward_line(cfg: Config) -> str:
    """What grades the run's replies, said on its first lines and by the dry run: the specs with
    their weights, or the task's own grader and how to use yours."""
    specs = reward_specs(cfg)
    text = " + ".join(s.name if s.weight == 1 else f"{s.weight:g} x {s.name}" for s in specs)
    kind = cfg.env.agent_kind()
    if kind is not None:  # rlvr.rollout.episodes.episode_scores: the agent's reward replaces them
        own = (
            f"the agent's own (env.name={cfg.env.name} returns it)"
            if kind == "agent"
            else f"the verifiers environment's rubric (env.name={cfg.env.name})"
        )
        return own + (f"; logged beside, not scored: {text}" if text else "")
    if cfg.reward.specs:
        return text
    return (
        f"{text} (data.task={cfg.data.task}'s grader: reward.specs is empty; "
        "reward.specs=[{name: 'module:function'}] grades with your own)"
    )
