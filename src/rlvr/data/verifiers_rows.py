"""``data.task=verifiers:package.module``: rows from a verifiers environment's own dataset.

The module's ``load_environment(**data.task_kwargs)`` (verifiers' convention) builds the
environment; its ``get_dataset()`` gives the train rows and ``get_eval_dataset()`` the held-out
rows (the dataset's rows after the train rows where it has no eval dataset). Each row keeps the
dataset's row as it is under ``verifiers`` (what the environment's rollout starts from:
rlvr.rollout.agents), its last user message as ``prompt`` (logs, samples) and ``answer``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import signal
from collections.abc import Iterator
from typing import Any

PREFIX = "verifiers:"


def is_verifiers_task(name: str) -> bool:
    return name.startswith(PREFIX)


@contextlib.contextmanager
def _signal_handlers_kept() -> Iterator[None]:
    """verifiers' Environment sets its own SIGINT and SIGTERM handlers when it is built (a
    teardown, then exit(143)): in the trainer they would replace the stop-signal handlers that
    write a checkpoint within train.stop_grace_s (rlvr.training.preempt)."""
    kept = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in kept.items():
            if handler is not None:  # None: set outside Python, cannot be put back
                signal.signal(s, handler)


def load_environment(module: str, kwargs: dict) -> Any:
    """``module.load_environment(**kwargs)`` (verifiers' convention), the process's signal
    handlers as they were. Raises ImportError, AttributeError (no load_environment) or what the
    module's function raises."""
    mod = importlib.import_module(module)
    load = mod.load_environment
    with _signal_handlers_kept():
        return load(**kwargs)


def verifiers_rows(
    task: str, *, num_train: int, num_eval: int, seed: int, **kwargs: Any
) -> tuple[list[dict], list[dict]]:
    module = task[len(PREFIX) :]
    try:
        env = load_environment(module, kwargs)
    except (ImportError, AttributeError, TypeError) as exc:
        raise ValueError(f"data.task={task!r}: {type(exc).__name__}: {exc}") from exc
    train = env.get_dataset(seed=seed)
    has_eval = env.eval_dataset is not None or env.eval_dataset_source is not None
    train_rows = [_row(r) for r in train.select(range(min(num_train, len(train))))]
    if has_eval:
        held = env.get_eval_dataset(n=num_eval)
        eval_rows = [_row(r) for r in held]
    else:
        rest = range(len(train_rows), min(len(train), len(train_rows) + num_eval))
        eval_rows = [_row(train[i]) for i in rest]
    if not train_rows:
        raise ValueError(f"data.task={task!r}: the environment's dataset has no rows")
    return train_rows, eval_rows


def _row(source: dict) -> dict:
    source = json.loads(json.dumps(dict(source), default=str))  # plain JSON, as rows are kept
    prompt = source.get("prompt")
    text = prompt if isinstance(prompt, str) else ""
    if isinstance(prompt, list):
        users = [
            m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"
        ]
        text = users[-1] if users and isinstance(users[-1], str) else json.dumps(prompt)
    return {"prompt": text, "answer": str(source.get("answer", "")), "verifiers": source}
