"""Turn the reward config into one batch scorer that survives bad rewards.

``RewardRunner(specs).score_batch(...)`` scores every completion with every configured
reward and returns the weighted sum per completion. A reward that raises, returns a
non-number / NaN / inf / None, or runs longer than ``timeout_s`` marks that completion
invalid (the trainer gives it zero advantage and leaves it out of the loss); the batch
goes on. Only when more than ``max_failure_fraction`` of a batch is invalid does the
runner raise ``RewardFailureError``, with the first failure's traceback in the message.

Where each reward runs:

- built-ins (``math``, ``gsm8k``, ``countdown``, ``psgrpo``, ``math_prm``, ``code``) run in
  this process: they are our code and bound their own time (the maths grader sends only its
  symbolic stage to a sandbox process; the code reward runs the model's program in
  ``rlvr.sandbox``, each run under its share of the sample's time), so 64 numeric answers take
  milliseconds;
- user functions (``package.module:function``) and the built-ins that call another package's
  scorer (``reasoning_gym``: registry.POOLED_BUILTINS) run in a pool of sandbox processes
  (``pool.SandboxPool``); a call that overruns has its process killed and replaced, so a
  function that sleeps forever costs one ``timeout_s``, not the run.

Every reward is called as ``f(prompt, response, reference, **row, truncated=bool)``
where ``row`` is the dataset row without its ``prompt``/``response``/``reference``/
``truncated`` keys; a user spec's ``kwargs`` are added to the keyword arguments.
"""

from __future__ import annotations

import inspect
import json
import math
import numbers
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from rlvr.config.peer_names import near_miss
from rlvr.config.reward import RewardSpec
from rlvr.rewards import symbolic
from rlvr.rewards.base import RewardResult
from rlvr.rewards.pool import CallOutcome, SandboxPool
from rlvr.rewards.registry import (
    BUILTIN_REWARDS,
    POOLED_BUILTINS,
    POOLED_PRELOAD,
    check_kwargs,
    is_user_target,
    make_builtin,
)
from rlvr.rewards.sandbox import WorkerDied, resolve_target

__all__ = [
    "BatchRewards",
    "RewardFailureError",
    "RewardRunner",
    "RewardSpec",
    "builtin_reward_names",
    "is_return_error",
    "is_timeout_error",
    "reward_kwargs",
    "resolve_reward_names",
    "validate_reward_spec",
]

_RESERVED_ROW_KEYS = ("prompt", "response", "reference", "truncated")
# How _coerce's messages begin: a reward that returned something other than a finite number.
_RETURN_ERRORS = ("returned ", "info is a ", "info[")


def reward_kwargs(row: dict[str, Any], truncated: bool) -> dict[str, Any]:
    """The keyword arguments a reward is called with for ``row``: the row's fields but its
    prompt/response/reference/truncated, then ``truncated`` (a spec's kwargs come on top)."""
    return {
        **{k: v for k, v in row.items() if k not in _RESERVED_ROW_KEYS},
        "truncated": bool(truncated),
    }


def is_timeout_error(error: str) -> bool:
    """True when a completion's error says a reward ran past its time limit (the pool killed
    it, or an in-process built-in took too long)."""
    rest = error.partition(": ")[2]
    return rest.startswith("timed out after ") or "more than timeout_s=" in rest


def is_return_error(error: str) -> bool:
    """True when a completion's error (``BatchRewards.error``) says a reward returned no finite
    number (None, a string, a list, NaN), not that it raised."""
    return error.partition(": ")[2].startswith(_RETURN_ERRORS)


class RewardFailureError(RuntimeError):
    """Too many completions of a batch could not be scored."""


def builtin_reward_names() -> list[str]:
    return sorted({*BUILTIN_REWARDS, *POOLED_BUILTINS})


def _resolve_user_function(name: str) -> Callable[..., Any]:
    module_name = name.partition(":")[0]
    try:
        fn = resolve_target(name)
    except ModuleNotFoundError as exc:
        raise ValueError(
            f"reward {name!r}: cannot import module {module_name!r} ({exc}); {_where_looked()}"
        ) from exc
    except AttributeError as exc:
        raise ValueError(f"reward {name!r}: {exc}{_function_hint(name)}") from exc
    except Exception as exc:  # the module itself raised while importing
        raise ValueError(
            f"reward {name!r}: importing {module_name!r} failed ({type(exc).__name__}: {exc})"
        ) from exc
    if not callable(fn):
        raise ValueError(f"reward {name!r} is a {type(fn).__name__}, not a function")
    return fn


def _function_hint(name: str) -> str:
    """'; did you mean ...' when the module has a function the name misspells."""
    module_name, _, attr = name.partition(":")
    try:
        module = sys.modules.get(module_name) or __import__(module_name, fromlist=["_"])
    except Exception:  # noqa: BLE001 - only a hint
        return ""
    functions = [k for k, v in vars(module).items() if callable(v) and not k.startswith("_")]
    close = near_miss(attr, functions)
    return f"; did you mean {close!r}?" if close else ""


def _module_form(name: str) -> str | None:
    """'pkg.mod:function' for a reward named by its file ('pkg/mod.py:function'), else None."""
    path, sep, function = name.rpartition(":")
    if not sep or not (path.endswith(".py") or "/" in path):
        return None
    module = path.removesuffix(".py").lstrip("./").replace("/", ".")
    return f"{module}:{function}" if module and function else None


def _where_looked() -> str:
    """Where Python looked for a reward's module, and how to put it there."""
    cwd = os.getcwd()
    here = cwd in [os.path.abspath(p or ".") for p in sys.path]
    pythonpath = os.environ.get("PYTHONPATH", "")
    return (
        f"Python looked in the directory rlvr runs in ({cwd}{'' if here else ': not searched'}), "
        f"PYTHONPATH ({pythonpath or 'unset'}) and the installed packages: run rlvr from the "
        "folder that holds the .py file, or add that folder to PYTHONPATH"
    )


def validate_reward_spec(spec: RewardSpec | dict[str, Any]) -> None:
    """Check a spec without loading any model; ValueError naming the spec if it is wrong.

    Built-ins: the kwargs must fit the built-in (a PRM given as ``package.module:function``
    is imported). User functions: the module is imported and the function must exist.
    """
    if not isinstance(spec, RewardSpec):
        try:
            spec = RewardSpec.model_validate(spec)
        except ValidationError as exc:
            raise ValueError(f"reward spec {spec!r} is invalid: {exc}") from exc
    module_form = _module_form(spec.name)
    if module_form is not None and "/" not in spec.name:  # 'pkg.py:f' may be a module 'py'
        try:
            _resolve_user_function(spec.name)
            module_form = None
        except ValueError:
            pass
    if module_form is not None:
        raise ValueError(
            f"reward spec {spec.name!r}: a reward is named by its module, not its file; did you "
            f"mean {module_form!r}? (run rlvr from the folder above it, or put that folder on "
            "PYTHONPATH)"
        )
    if spec.name in POOLED_BUILTINS:
        if spec.kwargs:
            raise ValueError(
                f"reward spec {spec.name!r} takes no kwargs, got {sorted(spec.kwargs)}"
            )
        return
    if spec.name in BUILTIN_REWARDS:
        try:
            check_kwargs(spec.name, spec.kwargs)
        except ValueError as exc:
            raise ValueError(f"reward spec {spec.name!r}: {exc}") from exc
        prm = spec.kwargs.get("prm")
        if isinstance(prm, str) and is_user_target(prm):
            _resolve_user_function(prm)
        return
    if is_user_target(spec.name):
        _resolve_user_function(spec.name)
        return
    close = near_miss(spec.name, builtin_reward_names())
    raise ValueError(
        f"reward spec {spec.name!r}: unknown reward"
        + (f" (did you mean {close!r}?)" if close else "")
        + f"; built-ins are {builtin_reward_names()}, or name your own function as "
        "'package.module:function'"
    )


def resolve_reward_names(names: Sequence[str]) -> list[str]:
    """Check that every name is a built-in or an importable ``package.module:function``
    (kwargs not checked); returns the names. ValueError names the first bad one."""
    for name in names:
        if name not in BUILTIN_REWARDS:
            validate_reward_spec(RewardSpec(name=name))
    return list(names)


@dataclass
class BatchRewards:
    """Scores of one batch; all lists have one entry per completion.

    ``scores``: weighted sum of the rewards (0.0 where invalid). ``infos``: the rewards'
    info dicts merged (a later spec's key wins a clash) plus ``reward/<name>`` per reward
    when there are several; {} where invalid. ``valid``: False where any reward failed.
    ``failures``: one line per failed (completion, reward); the first has its traceback.
    ``errors``: per completion, why it could not be scored (each failed reward's name and
    message, no traceback), None where it was; empty where not known (a batch put together
    from parts).
    """

    scores: list[float]
    infos: list[dict[str, float]]
    valid: list[bool]
    failures: list[str]
    errors: list[str | None] = field(default_factory=list)

    def error(self, i: int) -> str | None:
        """Why completion ``i`` could not be scored; None where it was (or is not known)."""
        return self.errors[i] if i < len(self.errors) else None

    def metrics(self) -> dict[str, float]:
        """``reward_failures``, ``reward_failure_rate`` and the mean of each info key over
        the valid completions that report it."""
        total = len(self.valid)
        invalid = total - sum(self.valid)
        out = {
            "reward_failures": float(invalid),
            "reward_failure_rate": invalid / total if total else 0.0,
        }
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        for info, ok in zip(self.infos, self.valid, strict=True):
            if not ok:
                continue
            for key, value in info.items():
                sums[key] = sums.get(key, 0.0) + value
                counts[key] = counts.get(key, 0) + 1
        out.update({key: sums[key] / counts[key] for key in sums})
        return out


def _coerce(value: Any) -> RewardResult:
    """A reward's return value as a RewardResult with finite floats; raises if it is not one."""
    if isinstance(value, RewardResult):
        score, info = value.score, value.info
    elif isinstance(value, numbers.Real):
        score, info = value, {}
    else:
        raise TypeError(f"returned {type(value).__name__}, expected a float or a RewardResult")
    if not isinstance(score, numbers.Real) or not math.isfinite(float(score)):
        raise ValueError(f"returned a non-finite or non-numeric score {score!r}")
    if not isinstance(info, dict):
        raise TypeError(f"info is a {type(info).__name__}, expected a dict of floats")
    clean: dict[str, float] = {}
    for key, item in info.items():
        if not isinstance(item, numbers.Real) or not math.isfinite(float(item)):
            raise ValueError(f"info[{key!r}] = {item!r} is not a finite number")
        clean[str(key)] = float(item)
    return RewardResult(float(score), clean)


class RewardRunner:
    """Scores batches with the configured rewards; see the module docstring.

    ``timeout_s`` bounds each reward call; ``num_workers`` sandbox processes serve user
    functions (none are started if there are none). Use as a context manager or call
    ``close()`` to stop the processes.
    """

    def __init__(
        self,
        specs: Sequence[RewardSpec | dict[str, Any]],
        *,
        timeout_s: float = 5.0,
        max_failure_fraction: float = 0.5,
        num_workers: int = 2,
    ) -> None:
        if not specs:
            raise ValueError("at least one reward spec is required")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        if not 0.0 <= max_failure_fraction <= 1.0:
            raise ValueError(f"max_failure_fraction must be in [0, 1], got {max_failure_fraction}")
        self.specs = [
            s if isinstance(s, RewardSpec) else RewardSpec.model_validate(s) for s in specs
        ]
        names = [s.name for s in self.specs]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"reward names must be unique, repeated: {duplicates}")
        self.timeout_s = timeout_s
        self.max_failure_fraction = max_failure_fraction
        self.warned = False  # the first failure is told once, with its traceback
        self._local: dict[str, Callable[..., Any]] = {}
        for spec in self.specs:
            validate_reward_spec(spec)
            if spec.name in BUILTIN_REWARDS:
                self._local[spec.name] = make_builtin(spec.name, self._builtin_kwargs(spec))
        self._pool: SandboxPool | None = None
        self._targets = {
            s.name: POOLED_BUILTINS.get(s.name, s.name)
            for s in self.specs
            if s.name not in BUILTIN_REWARDS
        }
        user_modules = tuple(
            sorted(
                {t.partition(":")[0] for t in self._targets.values()}
                | {m for name in self._targets for m in POOLED_PRELOAD.get(name, ())}
            )
        )
        if user_modules:
            # Imported before a worker reports ready, so no call's time limit pays for it.
            self._pool = SandboxPool(num_workers, preload=user_modules)
        if any(s.name in ("math", "psgrpo", "math_prm") for s in self.specs):
            symbolic.warm_up()  # its first use would otherwise wait for sympy to import

    def _builtin_kwargs(self, spec: RewardSpec) -> dict[str, Any]:
        """The spec's kwargs; a built-in's own ``timeout_s`` defaults to half the runner's
        so a slow answer is graded wrong before the runner declares the call failed."""
        kwargs = dict(spec.kwargs)
        timeout_param = inspect.signature(BUILTIN_REWARDS[spec.name]).parameters.get("timeout_s")
        if timeout_param is not None and "timeout_s" not in kwargs:
            kwargs["timeout_s"] = min(timeout_param.default, self.timeout_s / 2)
        return kwargs

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        symbolic.shutdown()

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run_local(
        self, fn: Callable[..., Any], args: tuple[str, str, str], kwargs: dict[str, Any]
    ) -> CallOutcome:
        start = time.monotonic()
        try:
            value = fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - contained and reported per sample
            return CallOutcome(
                False, error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()
            )
        elapsed = time.monotonic() - start
        if elapsed > self.timeout_s:
            return CallOutcome(
                False,
                error=f"took {elapsed:.2f} s, more than timeout_s={self.timeout_s}",
                timed_out=True,
            )
        return CallOutcome(True, value=value)

    def score_batch(
        self,
        prompts: list[str],
        responses: list[str],
        references: list[str],
        rows: list[dict[str, Any]],
        truncated: list[bool],
        where: str = "",
    ) -> BatchRewards:
        """Score one batch (all lists of equal length); raises RewardFailureError when more
        than ``max_failure_fraction`` of it cannot be scored. The runner's first failure is told
        once on stderr (``where``: "step 3", "evaluation"), with its reward, row, reply and
        traceback; later ones are counted in the metrics and kept per completion (``errors``)."""
        lists = {
            "prompts": prompts,
            "responses": responses,
            "references": references,
            "rows": rows,
            "truncated": truncated,
        }
        sizes = {name: len(values) for name, values in lists.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"score_batch needs lists of equal length, got {sizes}")
        count = len(prompts)
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise ValueError(f"rows[{i}] must be a dict, got {type(row).__name__}")
        kwargs_per_sample = [reward_kwargs(row, t) for row, t in zip(rows, truncated, strict=True)]
        # the small epsilon keeps e.g. 0.7 * 90 = 62.99999999999999 at 63 allowed failures
        max_failures = math.floor(self.max_failure_fraction * count + 1e-9)
        outcomes: dict[str, list[CallOutcome]] = {}
        for spec in self.specs:
            triples = list(zip(prompts, responses, references, strict=True))
            if spec.name in self._local:
                fn = self._local[spec.name]
                outcomes[spec.name] = [
                    self._run_local(fn, a, k)
                    for a, k in zip(triples, kwargs_per_sample, strict=True)
                ]
            else:
                assert self._pool is not None
                calls = [
                    (self._targets[spec.name], a, {**k, **spec.kwargs})
                    for a, k in zip(triples, kwargs_per_sample, strict=True)
                ]
                try:
                    outcomes[spec.name] = self._pool.map(
                        calls, timeout_s=self.timeout_s, max_failures=max_failures
                    )
                except WorkerDied as exc:  # cannot even start: a setup problem, not a sample's
                    raise RewardFailureError(f"reward {spec.name!r}: {exc}") from exc
        result = self._combine(outcomes, count)
        invalid = count - sum(result.valid)
        if invalid and not self.warned:
            self.warned = True
            first = next(i for i, ok in enumerate(result.valid) if not ok)
            text = first_failure_text(result, rows[first], responses[first], first, where)
            if is_timeout_error(result.error(first) or ""):
                text += (
                    f"\n  (a reward that needs longer: raise reward.timeout_s ({self.timeout_s} s))"
                )
            _tell(text)
        if invalid > max_failures:
            shown = next((f for f in result.failures if "Traceback" in f), result.failures[0])
            raise RewardFailureError(
                f"{invalid} of {count} completions could not be scored (more than "
                f"reward.max_failure_fraction={self.max_failure_fraction}); for example:\n{shown}"
            )
        return result

    def _combine(self, outcomes: dict[str, list[CallOutcome]], count: int) -> BatchRewards:
        scores, infos, valid, failures, why = [], [], [], [], []
        several = len(self.specs) > 1
        for i in range(count):
            total, info, errors = 0.0, {}, []
            for spec in self.specs:
                outcome = outcomes[spec.name][i]
                if outcome.ok:
                    try:
                        result = _coerce(outcome.value)
                    except (TypeError, ValueError) as exc:
                        outcome = CallOutcome(False, error=str(exc))
                if not outcome.ok:
                    line = f"sample {i}, reward {spec.name!r}: {outcome.error}"
                    if outcome.traceback and not any("Traceback" in f for f in failures):
                        line += "\n" + outcome.traceback.rstrip()
                    errors.append(f"reward {spec.name!r}: {outcome.error}")
                    failures.append(line)
                    continue
                total += spec.weight * result.score
                info.update(result.info)
                if several:
                    info[f"reward/{spec.name}"] = result.score
            ok = not errors
            scores.append(total if ok else 0.0)
            infos.append(info if ok else {})
            valid.append(ok)
            why.append(None if ok else "; ".join(errors))
        return BatchRewards(scores, infos, valid, failures, why)


MAX_SHOWN_CHARS = 300


def _clip(text: str) -> str:
    return text if len(text) <= MAX_SHOWN_CHARS else text[:MAX_SHOWN_CHARS] + " ..."


def first_failure_text(
    result: BatchRewards, row: dict[str, Any], response: str, index: int, where: str = ""
) -> str:
    """The warning for a run's first reward failure: which reward, how many of the batch, the
    row and reply it failed on, its traceback, and where the rest are kept."""
    count, invalid = len(result.valid), len(result.valid) - sum(result.valid)
    at = f" in the {where}" if where == "evaluation" else (f" at {where}" if where else "")
    fate = (
        "graded wrong and flagged in the records' 'reward_errors'"
        if where == "evaluation"
        else "no advantage, left out of the loss; more than reward.max_failure_fraction of a "
        "batch stops the run"
    )
    shown = json.dumps({k: v for k, v in row.items() if not k.startswith("_")}, default=str)
    trace = next((f for f in result.failures if f.startswith(f"sample {index},")), "")
    trace = trace.partition("\n")[2] or result.error(index) or ""
    return "\n".join(
        [
            f"[rlvr] warning: {result.error(index)}: {invalid} of {count} completions could "
            f"not be scored{at} ({fate}). The first:",
            f"  row: {_clip(shown)}",
            f"  response: {_clip(response)!r}",
            *("  " + line for line in trace.rstrip().splitlines()),
            "  (said once; every failure's message: RUN_DIR/samples/step_N.jsonl "
            "'reward_error', the rate: reward_failure_rate in metrics.jsonl, the progress bar "
            "and `rlvr report`; evaluations flag them in 'reward_errors')",
        ]
    )


def _tell(text: str) -> None:
    """On stderr, above a progress bar if one is drawn."""
    from tqdm.auto import tqdm

    tqdm.write(text, file=sys.stderr)
