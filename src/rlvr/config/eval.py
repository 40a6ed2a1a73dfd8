"""The `eval` section of the run config: when to evaluate, on which named sets, in which modes.

    eval:
      every: 10                      # also evaluate every 10 steps (before/after always)
      modes: [greedy, {kind: sampling, k: 8, temperature: 0.6}]
      sets:
        - {name: heldout}                                # the run's own held-out split
        - {name: id_probe, split: train, max_problems: 50}
        - {name: ood_probe, path: data/probe_ood.jsonl, modes: [greedy]}
      best_metric: eval/ood_probe/greedy_pass@1          # recorded in best.json
      early_stop: {enabled: true, patience: 2}           # metric defaults to best_metric

Metric names are ``eval/<set>/<metric>`` where the metric carries its mode's name
(``greedy_pass@1``; ``sampling_pass@k``, ``maj@k``, ``mean_acc@k``; ``nondet_proxy_pass@k``), so
scores of different modes are never mixed up (docs/evaluation.md). Names are checked here, when
the config loads: a typo in ``best_metric`` fails with the list of metrics the config will produce.

``eval.dtype`` is the precision of every evaluation, independent of the training autocast: bf16
autocast and float32 give different greedy replies for the same weights (46 of 100 identical on
SmolLM2-135M), so a default that followed the CPU's bf16 support would make the held-out score
depend on the machine. ``auto`` is float32 on the CPU (bfloat16 on a GPU); the value in force is
recorded with every result (``rlvr.eval.provenance``).
"""

from __future__ import annotations

import difflib
from typing import Any, Literal

from pydantic import Field, model_validator

from rlvr.config.base import Section
from rlvr.config.benchmarks import BENCHMARKS

HELDOUT = "heldout"
DEFAULT_SAMPLING_K = 8
# A common published sampling_pass@8 setting (temperature 0.6, top-p 1).
DEFAULT_SAMPLING_TEMPERATURE = 0.6
EVAL_DTYPES = ("auto", "float32", "bfloat16", "float16")
MODE_KINDS = ("greedy", "sampling", "nondet_proxy")


def _reject_unknown_keys(data: Any, cls: type[Section], where: str) -> None:
    """Unknown keys inside list items are not seen by the top-level key check: name them here."""
    if not isinstance(data, dict):
        return
    known = list(cls.model_fields)
    for key in data:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"{where}: unknown key {key!r}{hint} (known: {', '.join(known)})")


class EvalModeConfig(Section):
    """One evaluation mode: ``greedy`` (temperature 0, one response), ``sampling`` (k samples) or
    ``nondet_proxy`` (k temperature-0 replies: a diagnostic of nondeterministic decoding).

    A bare string is accepted: ``greedy``, ``sampling`` or ``nondet_proxy`` (defaults below).
    """

    kind: Literal["greedy", "sampling", "nondet_proxy"] = Field(
        description="greedy: temperature 0, n 1 -> greedy_pass@1; sampling: n k -> "
        "sampling_pass@k (any of k), maj@k (majority vote), mean_acc@k; nondet_proxy: k "
        "temperature-0 replies -> nondet_proxy_pass@k (measures nondeterminism, not skill)."
    )
    k: int | None = Field(
        None,
        ge=1,
        description=f"Samples per problem (sampling, nondet_proxy; default {DEFAULT_SAMPLING_K}).",
    )
    temperature: float | None = Field(
        None,
        gt=0.0,
        description=f"Sampling temperature (sampling only; default {DEFAULT_SAMPLING_TEMPERATURE}).",
    )
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling (sampling only).")

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, data: Any) -> Any:
        if isinstance(data, str):
            return {"kind": data}
        _reject_unknown_keys(data, cls, "eval.modes item")
        return data

    @model_validator(mode="after")
    def _greedy_is_one_sample(self) -> EvalModeConfig:
        if self.kind == "greedy" and (self.k not in (None, 1) or self.temperature is not None):
            raise ValueError(
                f"eval mode greedy is temperature 0 with one response (greedy_pass@1); got "
                f"k={self.k}, temperature={self.temperature}: use kind: sampling for k samples"
            )
        if self.kind == "nondet_proxy" and (self.temperature is not None or self.top_p != 1.0):
            raise ValueError(
                "eval mode nondet_proxy is temperature 0 (k greedy replies); it takes no "
                f"temperature or top_p, got temperature={self.temperature}, top_p={self.top_p}"
            )
        return self

    @property
    def samples(self) -> int:
        """Responses per problem: 1 for greedy, k for sampling."""
        return 1 if self.kind == "greedy" else (self.k or DEFAULT_SAMPLING_K)

    @property
    def sampling_temperature(self) -> float:
        """Temperature the mode samples at: 0 for greedy and nondet_proxy."""
        if self.kind != "sampling":
            return 0.0
        return self.temperature or DEFAULT_SAMPLING_TEMPERATURE

    @property
    def repeats(self) -> int:
        """Requests per problem: k for nondet_proxy (k separate greedy requests), else 1."""
        return self.samples if self.kind == "nondet_proxy" else 1

    def describe(self) -> dict:
        """Mode, k, temperature and top-p as the eval table prints them beside each number."""
        return {
            "mode": self.kind,
            "k": self.samples,
            "temperature": self.sampling_temperature,
            "top_p": self.top_p if self.kind == "sampling" else 1.0,
        }

    def metric_names(self) -> list[str]:
        """The metrics this mode reports; the first is its headline."""
        if self.kind == "greedy":
            return ["greedy_pass@1"]
        k = self.samples
        if self.kind == "nondet_proxy":
            return [f"nondet_proxy_pass@{k}"]
        return [f"sampling_pass@{k}", f"maj@{k}", f"mean_acc@{k}"]


class EvalSetConfig(Section):
    """One named evaluation set; its rows come from exactly one of path, split or task.

    With none of them the set must be named ``heldout`` (the run's held-out split) or a standard
    benchmark of `rlvr.config.benchmarks` (math500, aime24, ...: its hub rows, fields and grader).
    """

    name: str = Field(
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="Appears in metric names eval/<name>/<metric>: letters, digits, _ . -",
    )
    path: str | None = Field(None, description="A JSONL/JSON/CSV/Parquet file of problems.")
    split: Literal["heldout", "train"] | None = Field(
        None, description="A split of the run's own data (train: an in-distribution probe)."
    )
    task: str | None = Field(
        None, description="A built-in task generated for this set, e.g. arithmetic (OOD probe)."
    )
    task_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Options of `task`, e.g. {digits: 2}."
    )
    seed: int = Field(0, description="Seed of a generated `task` set.")
    prompt_field: str | None = Field(None, description="Default: data.prompt_field.")
    answer_field: str | None = Field(None, description="Default: data.answer_field.")
    answer_extract: Literal["none", "gsm8k", "boxed"] | None = Field(
        None, description="Default: data.answer_extract."
    )
    max_problems: int | None = Field(None, gt=0, description="Default: eval.max_problems.")
    grader: str | None = Field(
        None,
        description="Built-in reward that grades this set (e.g. math, gsm8k); default: a named "
        "benchmark's own, reasoning_gym for a reasoning_gym:<task> set, else the run's "
        "reward.specs.",
    )
    modes: list[str] | None = Field(
        None, description="Kinds from eval.modes to run on this set (default: all of them)."
    )

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        _reject_unknown_keys(data, cls, "eval.sets item")
        return data

    @model_validator(mode="after")
    def _one_source(self) -> EvalSetConfig:
        given = [k for k in ("path", "split", "task") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(
                f"eval set {self.name!r}: give one of path, split or task, not {' and '.join(given)}"
            )
        if not given and self.name != HELDOUT and self.name not in BENCHMARKS:
            close = difflib.get_close_matches(self.name, list(BENCHMARKS), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"eval set {self.name!r} has no rows{hint}: give path, split or task, or name a "
                f"standard benchmark ({', '.join(BENCHMARKS)}); the set named {HELDOUT!r} is the "
                "held-out split"
            )
        if self.task_kwargs and self.task is None:
            raise ValueError(f"eval set {self.name!r}: task_kwargs given without task")
        return self

    def resolved(self) -> EvalSetConfig:
        """This set with a named benchmark's path, fields, answer format and grader filled in
        (values given in the set win); other sets unchanged."""
        if self.grader is None and (self.task or "").startswith("reasoning_gym:"):
            return self.model_copy(update={"grader": "reasoning_gym"})  # the task's own scorer
        bench = BENCHMARKS.get(self.name)
        if bench is None or any(getattr(self, k) is not None for k in ("split", "task")):
            return self
        return self.model_copy(
            update={
                "path": self.path or bench.path,
                "prompt_field": self.prompt_field or bench.prompt_field,
                "answer_field": self.answer_field or bench.answer_field,
                "answer_extract": self.answer_extract or bench.answer_extract,
                "grader": self.grader or bench.grader,
            }
        )

    @property
    def source(self) -> str:
        """A short description of where the rows come from, for messages."""
        if self.path is not None or self.name in BENCHMARKS:
            return f"data {self.resolved().path}"
        if self.task is not None:
            return f"task {self.task} {self.task_kwargs or ''}".strip()
        return f"{self.split or HELDOUT} split"


class EarlyStopConfig(Section):
    enabled: bool = Field(
        False,
        description="Stop when `metric` got worse than the previous eval `patience` times in a row.",
    )
    metric: str | None = Field(None, description="Default: eval.best_metric.")
    patience: int = Field(2, ge=1, description="Consecutive drops that stop training (default 2).")
    min_delta: float = Field(0.0, ge=0.0, description="A drop must exceed this to count.")


class EvalConfig(Section):
    before_after: bool = Field(
        True, description="Evaluate before the first and after the last step."
    )
    every: int = Field(0, ge=0, description="Also evaluate every N steps (0: never).")
    max_problems: int = Field(100, gt=0, description="Problems per set (a set may set its own).")
    max_new_tokens: int | None = Field(None, description="Default: rollout.max_new_tokens.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="Precision of every evaluation (before/after, in training, save_best, early "
        "stop, rlvr eval), independent of model.autocast. auto: float32 on the CPU whatever its "
        "bf16 support, bfloat16 on a GPU, the weights' dtype when model.dtype=bfloat16.",
    )
    batch_size: int | None = Field(
        None,
        gt=0,
        description="Prompts per generate() call during evaluation (default: rollout.batch_size). "
        "Records do not depend on it (greedy is batch-invariant, sampling is seeded per prompt "
        "on the hf engine).",
    )
    sets: list[EvalSetConfig] = Field(
        default_factory=list,
        description=f"Named eval sets; empty: the held-out split as {HELDOUT!r}.",
    )
    modes: list[EvalModeConfig] = Field(
        default_factory=lambda: [EvalModeConfig(kind="greedy")],
        description="Eval modes, at most one per kind: greedy and/or sampling.",
    )
    best_metric: str | None = Field(
        None,
        description="Metric whose best eval goes to best.json (default: the first set's first "
        "mode's headline, e.g. eval/heldout/greedy_pass@1). Higher is better.",
    )
    early_stop: EarlyStopConfig = Field(default_factory=EarlyStopConfig)
    save_best: bool = Field(
        False, description="Also save the model of the best eval under RUN_DIR/best/."
    )
    seed: int = Field(0, description="Seed of sampling modes (the same in training and rlvr eval).")

    @model_validator(mode="after")
    def _names_resolve(self) -> EvalConfig:
        kinds = [m.kind for m in self.modes]
        if not kinds:
            raise ValueError(f"eval.modes is empty: give at least one of {', '.join(MODE_KINDS)}")
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"eval.modes: one mode per kind, got {kinds}")
        names = [s.name for s in self.sets]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"eval.sets: names must be unique, repeated: {repeated}")
        for s in self.sets:
            if s.modes == []:
                raise ValueError(f"eval set {s.name!r}: modes is empty (omit it to run all modes)")
            unknown = [m for m in s.modes or [] if m not in kinds]
            if unknown:
                raise ValueError(
                    f"eval set {s.name!r}: modes {unknown} are not in eval.modes (known: {kinds})"
                )
        known = self.metric_names()
        for field, value in (
            ("eval.best_metric", self.best_metric),
            ("eval.early_stop.metric", self.early_stop.metric),
        ):
            if value is not None and value not in known:
                close = difflib.get_close_matches(value, known, n=1, cutoff=0.6)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ValueError(
                    f"{field}={value!r} is not a metric this config produces{hint} "
                    f"(known: {', '.join(known)})"
                )
        return self

    def resolved_sets(self) -> list[EvalSetConfig]:
        """The configured sets, or the held-out split alone when none are configured."""
        return list(self.sets) or [EvalSetConfig(name=HELDOUT)]

    def modes_of(self, eval_set: EvalSetConfig) -> list[EvalModeConfig]:
        """The modes run on ``eval_set``, in eval.modes order."""
        wanted = eval_set.modes
        return [m for m in self.modes if wanted is None or m.kind in wanted]

    def metric_names(self) -> list[str]:
        """Every ``eval/<set>/<metric>`` this config logs, in set and mode order."""
        return [
            f"eval/{s.name}/{metric}"
            for s in self.resolved_sets()
            for mode in self.modes_of(s)
            for metric in mode.metric_names()
        ]

    def best_metric_name(self) -> str:
        """``best_metric``, or the first set's first mode's headline metric."""
        return self.best_metric or self.metric_names()[0]

    def early_stop_metric_name(self) -> str:
        return self.early_stop.metric or self.best_metric_name()
