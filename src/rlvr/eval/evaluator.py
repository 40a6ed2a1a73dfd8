"""Evaluation through exactly the code training uses: the same template, engine and reward runner.

An evaluation that takes a different path from the rollouts (another template, another
generation call) can under-report accuracy by many points; here `rlvr eval`, `rlvr data
filter-difficulty` and the in-training evaluator all call `generate_records()` (through
`evaluate_sets()` / `evaluate()`), and both evaluators write their results with `eval_payload()`,
so their files can be compared record for record.

With ``env.name`` set the records are episodes (``rlvr.rollout.episodes``, the runner training
uses, with the same limits): the reward specs grade each episode's last model turn, as in
training, and the scores come with the tool-call rate and turns (``reply_stats.episode_stats``).

Records do not depend on how prompts are batched: prompts go to the engine in chunks of
``batch_size``, greedy decoding is batch-invariant (tests/rollout), and sampling modes seed each
prompt by its index (``SamplingParams.prompt_seeds``) where the engine supports it (hf).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from rlvr.config.eval import EvalModeConfig
from rlvr.data.multimodal import render_inputs
from rlvr.eval.metrics import summarize
from rlvr.eval.reply_stats import episode_stats, reply_stats
from rlvr.jsonio import atomic_write_text
from rlvr.rewards.math import extract_answer
from rlvr.rewards.runner import RewardRunner
from rlvr.rollout.base import Completion, SamplingParams
from rlvr.rollout.episodes import EpisodeRunner, episode_scores


def sampling_params(
    mode: EvalModeConfig,
    max_new_tokens: int,
    stop: tuple[str, ...] = (),
    seed: int = 0,
    num_prompts: int | None = None,
) -> SamplingParams:
    """Engine parameters of ``mode``; with ``num_prompts`` a sampling mode seeds prompt i with
    seed + i (greedy and nondet_proxy are temperature 0, one reply per request)."""
    if mode.kind != "sampling":
        return SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new_tokens, stop=stop)
    seeds = None if num_prompts is None else tuple(seed + i for i in range(num_prompts))
    return SamplingParams(
        n=mode.samples,
        temperature=mode.sampling_temperature,
        top_p=mode.top_p,
        max_new_tokens=max_new_tokens,
        stop=stop,
        seed=seed,
        prompt_seeds=seeds,
    )


def generate_batched(
    engine,
    ids: list[list[int]],
    params: SamplingParams,
    *,
    batch_size: int = 0,
    repeats: int = 1,
    vision: list | None = None,
) -> list[list]:
    """``engine.generate`` over chunks of ``batch_size`` requests (0: all at once).

    Each prompt is sent ``repeats`` times (nondet_proxy) and its completions regrouped;
    ``params.prompt_seeds`` (one per prompt) and the prompts' images (``vision``, one
    ``PromptVision`` per prompt) are sliced along with the chunks.
    """
    flat = [p for p in ids for _ in range(repeats)]
    flat_vision = None if vision is None else [v for v in vision for _ in range(repeats)]
    seeds = params.prompt_seeds
    if seeds is not None and repeats != 1:
        raise ValueError("prompt_seeds with repeated requests: seed each request instead")
    step = batch_size or len(flat) or 1
    groups: list[list] = []
    for start in range(0, len(flat), step):
        chunk = (
            params if seeds is None else replace(params, prompt_seeds=seeds[start : start + step])
        )
        images = {} if flat_vision is None else {"vision": flat_vision[start : start + step]}
        groups.extend(engine.generate(flat[start : start + step], chunk, **images))
    return [
        [c for g in groups[i * repeats : (i + 1) * repeats] for c in g] for i in range(len(ids))
    ]


def generate_records(
    engine,
    tokenizer,
    rows: list[dict],
    rewards,
    *,
    template: str,
    system_prompt: str | None,
    params: SamplingParams,
    batch_size: int = 0,
    repeats: int = 1,
    processor=None,
    episodes: EpisodeRunner | None = None,
) -> list[dict]:
    """Per-problem records: prompt, reference, responses, extracted answers, correctness, scores,
    finish reasons and reply lengths in tokens. Rows with images need a VLM's ``processor``.

    ``episodes`` (env.name set): each response is an episode, its text every turn; the answer
    and the grade come from its last model turn (or the environment's reward, where it gives
    it), lengths count the model's tokens, and each record adds turns and tool calls."""
    if episodes is None:
        texts, ids, vision = render_inputs(rows, template, tokenizer, system_prompt, processor)
        groups = generate_batched(
            engine, ids, params, batch_size=batch_size, repeats=repeats, vision=vision
        )
    else:
        texts, groups = play_batched(
            episodes, engine, rows, params, batch_size=batch_size, repeats=repeats
        )
    flat_rows = [r for r, g in zip(rows, groups, strict=True) for _ in g]
    comps = [c for g in groups for c in g]
    scored = rewards.score_batch(
        [t for t, g in zip(texts, groups, strict=True) for _ in g],
        [c.response for c in comps],  # an episode's last model turn
        [r["answer"] for r in flat_rows],
        flat_rows,
        [c.truncated for c in comps],
        where="evaluation",
    )
    all_scores, all_valid = episode_scores(comps, scored.scores, scored.valid)
    records, k = [], 0
    for row, g in zip(rows, groups, strict=True):
        n = len(g)
        infos = scored.infos[k : k + n]
        scores, valid = all_scores[k : k + n], all_valid[k : k + n]
        record = {
            "source": row.get("_source"),
            "prompt": row["prompt"],
            "reference": row["answer"],
            "responses": [c.text for c in g],
            "answers": [extract_answer(c.response)[0] for c in g],
            "correct": [
                _correct(c, i, s) and ok
                for c, i, s, ok in zip(g, infos, scores, valid, strict=True)
            ],
            "scores": [float(s) for s in scores],
            # a reply whose grading failed counts as wrong; this says which and why
            "reward_errors": [scored.error(k + j) for j in range(n)],
            "finish_reasons": [c.finish_reason for c in g],
            "lengths": [c.model_token_count for c in g],
        }
        if episodes is not None:
            record.update(_episode_fields(g))
        records.append(record)
        k += n
    return records


def _correct(c: Completion, info: dict, score: float) -> bool:
    """The reward specs' verdict on the reply; an environment that scores its episode: its
    reward >= 1."""
    ep = c.episode
    if ep is not None and (
        ep.gives_reward or (ep.gives_reward is None and ep.env_reward is not None)
    ):
        return score >= 1.0
    return bool(info.get("correct", score >= 1.0))


def _episode_fields(group: list[Completion]) -> dict:
    eps = [c.episode for c in group]
    return {
        "turns": [e.turns for e in eps],
        "tool_calls": [e.tool_calls for e in eps],
        "tool_failures": [e.tool_failures for e in eps],
        "env_failed": [e.failed for e in eps],
    }


def play_batched(
    episodes: EpisodeRunner,
    engine,
    rows: list[dict],
    params: SamplingParams,
    *,
    batch_size: int = 0,
    repeats: int = 1,
) -> tuple[list[str], list[list[Completion]]]:
    """``params.n`` episodes of each row, ``batch_size`` rows at a time (0: all at once), each
    row played ``repeats`` times (nondet_proxy) and its episodes regrouped: (prompt texts,
    groups). ``params.prompt_seeds`` (one per row) are sliced along with the chunks."""
    flat = [r for r in rows for _ in range(repeats)]
    seeds = params.prompt_seeds
    if seeds is not None and repeats != 1:
        raise ValueError("prompt_seeds with repeated requests: seed each request instead")
    step = batch_size or len(flat) or 1
    texts: list[str] = []
    groups: list[list[Completion]] = []
    for start in range(0, len(flat), step):
        chunk = (
            params if seeds is None else replace(params, prompt_seeds=seeds[start : start + step])
        )
        t, _, g = episodes.run(engine, flat[start : start + step], chunk)
        texts += t
        groups += g
    return [texts[i * repeats] for i in range(len(rows))], [
        [c for g in groups[i * repeats : (i + 1) * repeats] for c in g] for i in range(len(rows))
    ]


def evaluate(
    engine,
    tokenizer,
    rows: list[dict],
    rewards,
    *,
    template: str,
    system_prompt: str | None,
    mode: EvalModeConfig,
    max_new_tokens: int,
    stop: tuple[str, ...] = (),
    seed: int = 0,
    batch_size: int = 0,
    processor=None,
    episodes: EpisodeRunner | None = None,
) -> tuple[dict, list[dict]]:
    """Run one mode over ``rows``; returns (named scores with reply stats, per-problem records);
    with ``episodes``, the scores of episodes with their tool calls (`generate_records`)."""
    params = sampling_params(mode, max_new_tokens, stop, seed, num_prompts=len(rows))
    records = generate_records(
        engine,
        tokenizer,
        rows,
        rewards,
        template=template,
        system_prompt=system_prompt,
        params=params,
        batch_size=batch_size,
        repeats=mode.repeats,
        processor=processor,
        episodes=episodes,
    )
    scores = summarize(records, mode.kind, k=None if mode.kind == "greedy" else mode.samples)
    stats = reply_stats(records, mode.kind)
    if episodes is not None:
        stats.update(episode_stats(records, mode.kind))
    return {**scores, **stats}, records


@dataclass(frozen=True)
class EvalSet:
    """A named list of problems (rows with "prompt" and "answer") and the modes run on it."""

    name: str
    rows: list[dict]
    modes: tuple[EvalModeConfig, ...]
    grader: str | None = None  # a built-in reward for this set; None: the run's rewards


@dataclass
class EvalOutcome:
    """What one evaluation of several sets produced.

    results: set name -> {metric: value} (metric names carry the mode: greedy_pass@1, maj@8, ...;
             beside them <mode>/truncated_frac and <mode>/mean_reply_tokens)
    records: set name -> mode kind -> per-problem records (see `generate_records`)
    modes: set name -> [mode, k, temperature, top_p of each mode run]
    provenance: how the numbers were measured (`rlvr.eval.provenance`), {} when not given
    """

    results: dict[str, dict[str, float]] = field(default_factory=dict)
    records: dict[str, dict[str, list[dict]]] = field(default_factory=dict)
    modes: dict[str, list[dict]] = field(default_factory=dict)
    provenance: dict = field(default_factory=dict)

    def metrics(self) -> dict:
        """Scores as ``eval/<set>/<metric>`` for metrics.jsonl (problem counts stay in the file),
        plus ``eval/provenance`` when known."""
        out: dict = {
            f"eval/{name}/{metric}": value
            for name, scores in self.results.items()
            for metric, value in scores.items()
            if not metric.endswith("num_prompts")
        }
        if self.provenance:
            out["eval/provenance"] = dict(self.provenance)
        return out


def evaluate_sets(
    engine,
    tokenizer,
    sets: list[EvalSet],
    rewards,
    *,
    template: str,
    system_prompt: str | None,
    max_new_tokens: int,
    stop: tuple[str, ...] = (),
    seed: int = 0,
    batch_size: int = 0,
    provenance: dict | None = None,
    processor=None,
    episodes: EpisodeRunner | None = None,
) -> EvalOutcome:
    """Every mode of every set through `evaluate()`; the one entry point of both evaluators.

    A set with its own ``grader`` is scored by that built-in reward (a runner made here and
    closed at the end) unless ``rewards`` is already exactly that reward.
    """
    outcome = EvalOutcome(provenance=dict(provenance or {}))
    own: dict[str, object] = {}
    try:
        for eval_set in sets:
            runner = _runner_for(eval_set.grader, rewards, own)
            _evaluate_set(
                outcome,
                engine,
                tokenizer,
                eval_set,
                runner,
                template=template,
                system_prompt=system_prompt,
                max_new_tokens=max_new_tokens,
                stop=stop,
                seed=seed,
                batch_size=batch_size,
                processor=processor,
                episodes=episodes,
            )
    finally:
        for runner in own.values():
            runner.close()
    return outcome


def _runner_for(grader: str | None, rewards, own: dict[str, object]):
    """The reward runner of a set: the run's, or one for the set's built-in ``grader``."""
    specs = getattr(rewards, "specs", None)
    if grader is None or (specs and [s.name for s in specs] == [grader]):
        return rewards
    if grader not in own:
        timeout = getattr(rewards, "timeout_s", 5.0)
        own[grader] = RewardRunner([{"name": grader}], timeout_s=timeout, max_failure_fraction=1.0)
    return own[grader]


def _evaluate_set(
    outcome: EvalOutcome, engine, tokenizer, eval_set: EvalSet, rewards, **kw: object
) -> None:
    """Every mode of one set into ``outcome``; ``kw`` are `evaluate()`'s keywords."""
    if not eval_set.rows:
        raise ValueError(f"eval set {eval_set.name!r} has no rows")
    outcome.results[eval_set.name] = {}
    outcome.records[eval_set.name] = {}
    outcome.modes[eval_set.name] = [m.describe() for m in eval_set.modes]
    for mode in eval_set.modes:
        scores, records = evaluate(engine, tokenizer, eval_set.rows, rewards, mode=mode, **kw)
        outcome.results[eval_set.name].update(scores)
        outcome.records[eval_set.name][mode.kind] = records


def eval_payload(outcome: EvalOutcome, **extra) -> dict:
    """The JSON both evaluators write: ``extra`` (step, model, ...), provenance, modes, results,
    records."""
    return {
        **extra,
        "provenance": outcome.provenance,
        "modes": outcome.modes,
        "results": outcome.results,
        "records": outcome.records,
    }


def write_eval_file(path: Path, payload: dict) -> Path:
    """Write ``payload`` as JSON atomically (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(payload, indent=1))
    return path
