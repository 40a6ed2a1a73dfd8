"""`rlvr train --dry-run`: the plan of a run, checked, without loading model weights.

Loads and validates the config, resolves the data (row counts), renders one example prompt
with the model's tokenizer (light: no weights), calls each of your own rewards once on the first
train row with a placeholder reply (a wrong signature fails here) and prints steps, samples per step, an upper
bound on tokens per step and the learning-rate schedule. What could not be checked (for
instance a tokenizer that is neither local nor cached while offline) is said, not skipped
silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rlvr.config import Config
from rlvr.data.hub import HubUnreachable
from rlvr.data.multimodal import has_images, render_inputs
from rlvr.data.records import DataError
from rlvr.data.rows import load_rows_for, reward_line, reward_specs
from rlvr.data.templates import render_prompt, render_rows
from rlvr.model.loading import (
    ModelLoadError,
    model_context_length,
    prepare_tokenizer,
    resolve_model_path,
)
from rlvr.model.vlm import is_vlm, load_processor
from rlvr.rewards.registry import is_user_target
from rlvr.rewards.runner import RewardRunner, is_return_error, is_timeout_error, reward_kwargs
from rlvr.rollout.agents import is_agent_env
from rlvr.rollout.episodes import EpisodeRunner
from rlvr.training.preflight.checks import config_problems, run_dir_taken
from rlvr.training.preflight.prompts import prompt_lengths, too_long
from rlvr.training.schedule import format_preflight, run_preflight


@dataclass
class Plan:
    """The numbers `--dry-run` prints; tests read them from here or from the text."""

    train_rows: int
    eval_rows: int
    steps: int
    prompts_per_step: int
    group_size: int
    sequences_per_step: int
    tokens_per_step_max: int
    epochs: float | None  # None: the train rows were not read (no hub, no file)
    example_prompt: str
    example_tokens: int | None
    longest_prompt_tokens: int | None
    schedule_text: str
    schedule_ok: bool
    problems: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)
    reward_checks: list[str] = field(default_factory=list)  # what each own reward did on row 1
    example_fields: list[str] = field(default_factory=list)  # the first train row's fields

    @property
    def ok(self) -> bool:
        return self.schedule_ok and not self.problems


def _processor(path: str, rows: list[dict]):
    """A vision-language model's processor when the rows carry images (no weights loaded)."""

    return load_processor(path) if has_images(rows) and is_vlm(path) else None


def _load_tokenizer(cfg: Config, unchecked: list[str]):
    """The model's tokenizer, or None (with the reason appended to ``unchecked``)."""

    try:
        path = resolve_model_path(cfg.model.name_or_path, convert=False)
        from transformers import AutoTokenizer

        return path, prepare_tokenizer(AutoTokenizer.from_pretrained(path))
    except (OSError, ValueError, ModelLoadError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        unchecked.append(
            f"tokenizer of model.name_or_path={cfg.model.name_or_path!r} could not be loaded "
            f"({first}); prompt token counts not checked"
        )
        return None, None


def _example(cfg: Config, tokenizer, row: dict, processor) -> str:
    """The text the run sends for ``row``: its episodes' first prompt (env.reset), else the
    rendered prompt."""
    if cfg.episodes and not is_agent_env(cfg.env.name):
        runner = EpisodeRunner.from_config(cfg, tokenizer, warn=False)
        [text] = runner.first_prompts([row])
        return text if text is not None else runner.renderer.prompt_text(str(row["prompt"]))
    d = cfg.data
    return render_inputs([row], d.template, tokenizer, d.system_prompt, processor)[0][0]


PLACEHOLDER_REPLY = "The answer is 42."


def reward_call_problems(
    cfg: Config, row: dict, checks: list[str] | None = None, prompt: str | None = None
) -> list[str]:
    """Each of your own rewards (``module:function``) called once, as training calls it, on the
    first train row with a placeholder reply and ``prompt``, the text the run sends for the row
    (training scores against it; the raw question where it is not known): a signature that does not take the row's fields,
    or a return value that is no finite number (None, a string, TRL's list per batch, NaN: every
    reply would fail), fails here, not at step 1. What it returned, or raised (scoring or
    refusing a placeholder is the reward's business), is appended to ``checks``. Built-ins are
    not called (their signature is rlvr's own)."""
    out = []
    for i, spec in enumerate(reward_specs(cfg)):
        if not is_user_target(spec.name):
            continue
        with RewardRunner(
            [spec], timeout_s=cfg.reward.timeout_s, max_failure_fraction=1.0, num_workers=1
        ) as runner:
            runner.warned = True  # the problem below says it
            result = runner.score_batch(
                [row["prompt"] if prompt is None else prompt],
                [PLACEHOLDER_REPLY],
                [row["answer"]],
                [row],
                [False],
            )
        error = result.error(0)
        where = (
            f"reward.specs[{i}] ({spec.name}) on {row.get('_source', 'train row 1')} with a "
            f"placeholder reply {PLACEHOLDER_REPLY!r}"
        )
        if error is None:
            value = result.scores[0] / spec.weight if spec.weight else result.scores[0]
            if checks is not None:
                checks.append(f"{where}: returned {float(value)!r}")
            continue
        if is_return_error(error):
            out.append(
                f"{where}: {error}; a reward returns a float (0 for a wrong reply) or a "
                "RewardResult for every reply: one it cannot score fails (no advantage, and "
                "more than reward.max_failure_fraction of a batch stops the run)"
            )
            continue
        if is_timeout_error(error):
            if checks is not None:
                checks.append(
                    f"{where}: took longer than reward.timeout_s={cfg.reward.timeout_s} s (each "
                    "call that does scores nothing: raise reward.timeout_s if it needs longer)"
                )
            continue
        if "TypeError" not in error:
            if checks is not None:
                checks.append(
                    f"{where}: raised {error.partition(': ')[2]} (each reply it raises on "
                    "scores nothing; more than reward.max_failure_fraction of a batch stops "
                    "the run)"
                )
            continue
        fields = ", ".join([*reward_kwargs(row, False), *spec.kwargs])
        out.append(
            f"reward.specs[{i}] ({spec.name}): called on {row.get('_source', 'train row 1')} "
            f"with a placeholder reply, it failed: {error}. A reward is called as "
            f"f(prompt, response, reference, **fields) with this row's fields ({fields}) as "
            "keyword arguments: name the ones it reads and end with **kwargs"
        )
    return out


def make_plan(cfg: Config, *, max_token_rows: int = 1000, resuming: bool = False) -> Plan:
    """Everything `--dry-run` checks and prints. Raises ConfigError / DataError on bad input.
    A fresh run (not ``resuming``) named after a run directory that holds a run fails, as
    `rlvr train` would at once."""

    problems = config_problems(cfg)
    if not resuming and (taken := run_dir_taken(Path(cfg.train.output_dir) / cfg.run_name())):
        problems.append(taken)
    unchecked: list[str] = []
    try:
        train, evals = load_rows_for(cfg)
    except HubUnreachable as exc:  # offline: the plan is still printed, the data is not checked
        train, evals = [], []
        unchecked.append(f"data not read: {exc}")
    except DataError as exc:  # a missing local folder is already a problem; print the rest
        train, evals = [], []
        if not any(
            p.startswith(("data.train_path", "data.eval_path", "data.task")) for p in problems
        ):
            problems.append(f"data not read: {exc}")
    a, t, d = cfg.algo, cfg.train, cfg.data
    sequences = cfg.rollout_batch_sequences()
    path, tokenizer = _load_tokenizer(cfg, unchecked)
    example, example_tokens, longest = "", None, None
    if train:
        if tokenizer is None:
            try:
                example = render_prompt(d.template, train[0]["prompt"], None, d.system_prompt)
            except ValueError as exc:
                unchecked.append(f"example prompt not rendered: {exc}")
        else:
            sample = train[:max_token_rows]
            processor = _processor(path, sample)
            try:  # image rows: their image tokens count too; episodes: env.reset's prompt
                lengths = prompt_lengths(cfg, tokenizer, sample, processor)
                example = _example(cfg, tokenizer, sample[0], processor)
            except ValueError as exc:  # image rows for a text model, or without the chat template
                problems.append(f"data.task={d.task}: {exc}")
                texts, ids = render_rows(sample, d.template, tokenizer, d.system_prompt)
                example, lengths = texts[0], [len(x) for x in ids]
            example_tokens = lengths[0]
            longest = max(lengths)
            if (row := too_long(cfg, sample, lengths, "train")) is not None:
                problems.append(
                    f"data.max_prompt_tokens={d.max_prompt_tokens}: the longest of the first "
                    f"{len(sample)} train prompts has {longest} tokens (the first over it: {row})"
                )
            if len(train) > len(sample):
                unchecked.append(
                    f"prompt lengths checked on the first {len(sample)} of {len(train)} rows"
                )
    checks: list[str] = []
    if train and not any(p.startswith("reward.specs") for p in problems):
        problems.extend(reward_call_problems(cfg, train[0], checks, example or None))
    if path is not None:
        problems.extend(cfg.validate_against_model(model_context_length(path)))
    res = run_preflight(t)
    return Plan(
        train_rows=len(train),
        eval_rows=len(evals),
        steps=t.max_steps,
        prompts_per_step=a.prompts_per_step,
        group_size=a.group_size,
        sequences_per_step=sequences,
        tokens_per_step_max=sequences * (d.max_prompt_tokens + cfg.rollout.max_new_tokens),
        epochs=t.max_steps * a.prompts_per_step / len(train) if train else None,
        example_prompt=example,
        example_fields=sorted(k for k in train[0] if not k.startswith("_")) if train else [],
        example_tokens=example_tokens,
        longest_prompt_tokens=longest,
        schedule_text=format_preflight(res),
        schedule_ok=res.ok,
        problems=problems,
        unchecked=unchecked,
        reward_checks=checks,
    )


def _agent_note(cfg: Config, plan: Plan) -> str:
    """What the example is for an agent env.name: not a request the run sends."""
    if cfg.env.agent_kind() is None:
        return ""
    fields = ", ".join(plan.example_fields)
    return (
        "; data.template's rendering of the row, which the agent receives whole with its "
        f"fields {fields}: it writes its own requests"
    )


def format_plan(cfg: Config, plan: Plan) -> str:
    d, r = cfg.data, cfg.rollout
    source = d.train_path if d.task == "file" else f"built-in task {d.task!r}"
    tokens = "not counted" if plan.example_tokens is None else f"{plan.example_tokens} tokens"
    lines = [
        f"model: {cfg.model.name_or_path} (weights not loaded)",
        f"objective: {cfg.algo.objective}",
        f"data: {source}; template {d.template}",
        f"reward: {reward_line(cfg)}",
        *(f"inferred: {note}" for note in cfg.inferred().values()),
        f"train rows: {plan.train_rows}; eval rows: {plan.eval_rows}"
        + (" (data not read)" if plan.train_rows == 0 else ""),
        f"example prompt ({tokens}{_agent_note(cfg, plan)}):",
        *("  | " + line for line in plan.example_prompt.splitlines() or [""]),
    ]
    if plan.longest_prompt_tokens is not None:
        lines.append(
            f"longest prompt: {plan.longest_prompt_tokens} tokens "
            f"(data.max_prompt_tokens={d.max_prompt_tokens})"
        )
    lines += [
        f"steps: {plan.steps} (= {plan.epochs:.2f} epochs over the train rows)"
        if plan.epochs is not None
        else f"steps: {plan.steps} (epochs not known: the train rows were not read)",
        f"prompts/step: {plan.prompts_per_step}; group size: {plan.group_size}; "
        f"samples/step: {plan.sequences_per_step}",
        f"tokens/step <= {plan.tokens_per_step_max} (= {plan.sequences_per_step} x "
        f"({d.max_prompt_tokens} prompt + {r.max_new_tokens} new))",
        f"optimizer steps/step: {cfg.algo.minibatches * cfg.algo.epochs_per_batch}",
        "learning-rate schedule "
        f"({cfg.train.schedule}, warmup {cfg.train.warmup_steps}, peak {cfg.train.lr:g}):",
        plan.schedule_text,
    ]
    lines += [f"reward check: {c}" for c in plan.reward_checks]
    lines += [f"not checked: {u}" for u in plan.unchecked]
    lines += [f"config problem: {p}" for p in plan.problems]
    lines.append("dry run OK: nothing was trained" if plan.ok else "dry run FAILED")
    return "\n".join(lines)


def run_dry(cfg: Config, *, resuming: bool = False) -> int:
    """Print the plan; 0 when it passes every check, 2 otherwise."""
    plan = make_plan(cfg, resuming=resuming)
    print(format_plan(cfg, plan), flush=True)
    return 0 if plan.ok else 2
