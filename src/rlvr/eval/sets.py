"""Turn the `eval.sets` / `eval.modes` config into `EvalSet`s with their rows loaded.

Training and `rlvr eval RUN_DIR` both call `build_eval_sets`, so a set named in the config has
the same rows, in the same order, in both (the held-out split is truncated to the same
`max_problems`).
"""

from __future__ import annotations

from collections.abc import Callable

from rlvr.config.benchmarks import BENCHMARKS
from rlvr.config.eval import HELDOUT, EvalSetConfig
from rlvr.data.code_tasks import PACKAGED_SETS
from rlvr.data.loaders import load_rows
from rlvr.data.tasks import task_rows
from rlvr.eval.evaluator import EvalSet


def set_rows(
    set_cfg: EvalSetConfig,
    cfg,
    *,
    heldout_rows: Callable[[], list[dict]],
    train_rows: Callable[[], list[dict]],
) -> list[dict]:
    """The rows of one set, truncated to its max_problems.

    ``heldout_rows`` / ``train_rows`` are called only when a set needs them (building the
    train split of a file task reads the whole file).
    """
    set_cfg = set_cfg.resolved()  # a named benchmark's hub rows, fields and answer format
    limit = set_cfg.max_problems or cfg.eval.max_problems
    if set_cfg.path in PACKAGED_SETS:  # rows shipped inside a package (humaneval)
        rows = PACKAGED_SETS[set_cfg.path](limit)
    elif set_cfg.path is not None:
        rows = load_rows(
            set_cfg.path,
            prompt_field=set_cfg.prompt_field or cfg.data.prompt_field,
            answer_field=set_cfg.answer_field or cfg.data.answer_field,
            system_prompt=cfg.data.system_prompt,
            limit=limit,
            answer_extract=set_cfg.answer_extract or cfg.data.answer_extract,
        )
    elif set_cfg.task is not None:
        # The generator's held-out split holds `limit` distinct problems; its train split is
        # not used, so ask for one row of it.
        _, rows = task_rows(
            set_cfg.task, num_train=1, num_eval=limit, seed=set_cfg.seed, **set_cfg.task_kwargs
        )
    elif (set_cfg.split or HELDOUT) == HELDOUT:
        rows = heldout_rows()
        if not rows:
            raise ValueError(
                f"eval set {set_cfg.name!r} wants the held-out split, but this run has none "
                f"(data.task={cfg.data.task!r}, data.eval_path={cfg.data.eval_path!r})"
            )
    else:
        rows = train_rows()
    return rows[:limit]


def build_eval_sets(
    cfg,
    *,
    heldout_rows: Callable[[], list[dict]],
    train_rows: Callable[[], list[dict]],
    only: list[str] | None = None,
) -> list[EvalSet]:
    """`EvalSet`s for the config's sets (all of them, or those named in ``only``).

    With no sets configured the held-out split alone is the set ``heldout``; when the run
    has no held-out split that default set is left out instead of failing (nothing to
    evaluate, as before named sets existed).
    """
    configured = cfg.eval.resolved_sets()
    names = [s.name for s in configured]
    if only is not None:
        # a standard benchmark needs no configuration: `--sets math500,aime24`
        configured += [EvalSetConfig(name=n) for n in only if n in BENCHMARKS and n not in names]
        names = [s.name for s in configured]
        unknown = [n for n in only if n not in names]
        if unknown:
            raise ValueError(
                f"eval sets {unknown} are not configured; known: {', '.join(names)}; "
                f"standard benchmarks: {', '.join(BENCHMARKS)}"
            )
        configured = [s for s in configured if s.name in only]
    implicit = not cfg.eval.sets
    sets = []
    for set_cfg in configured:
        if implicit and set_cfg.name == HELDOUT and not heldout_rows():
            continue
        rows = set_rows(set_cfg, cfg, heldout_rows=heldout_rows, train_rows=train_rows)
        modes = tuple(cfg.eval.modes_of(set_cfg))
        sets.append(EvalSet(set_cfg.name, rows, modes, grader=set_cfg.resolved().grader))
    return sets
