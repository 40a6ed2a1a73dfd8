"""Built-in tasks generated from a seed, so examples and tests need no download.

Each generator returns ``(train_rows, eval_rows)`` with zero overlap between the splits: every
distinct problem lands in exactly one split. Rows are dicts with ``prompt`` and ``answer`` (str); ``code_fn`` rows
add the ``tests`` the code reward runs (rlvr.data.code_tasks).
"""

from __future__ import annotations

import itertools
import random
from fractions import Fraction

from rlvr.data.code_tasks import code_fn_rows
from rlvr.data.reasoning_gym import is_reasoning_gym, reasoning_gym_rows
from rlvr.data.tasks_shapes import shapes_rows
from rlvr.data.verifiers_rows import is_verifiers_task, verifiers_rows

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def _check_ops(ops: list[str]) -> None:
    for op in ops:
        if op not in _OPS:
            raise ValueError(
                f"data.task_kwargs.ops: unknown operator {op!r}; known: {sorted(_OPS)}"
            )


def arithmetic_rows(
    *,
    num_train: int,
    num_eval: int,
    seed: int = 0,
    ops: list[str] | None = None,
    digits: int = 1,
    question: str = "What is {a} {op} {b}?",
) -> tuple[list[dict], list[dict]]:
    """Integer arithmetic problems ``a op b`` with operands of ``digits`` digits.

    The held-out split takes ``num_eval`` distinct problems first; the train split is drawn (with
    repetition if needed) from the remaining problems only.
    """
    ops = ops or ["+", "*"]
    _check_ops(ops)
    if digits < 1:
        raise ValueError(f"data.task_kwargs.digits={digits}: must be >= 1")
    lo = 0 if digits == 1 else 10 ** (digits - 1)
    hi = 10**digits - 1
    space = [(a, op, b) for op in ops for a, b in itertools.product(range(lo, hi + 1), repeat=2)]
    rng = random.Random(seed)
    rng.shuffle(space)
    if num_eval >= len(space):
        raise ValueError(
            f"data.num_eval={num_eval} leaves no training problems: the task has only {len(space)} "
            "distinct problems"
        )
    held, rest = space[:num_eval], space[num_eval:]

    def row(a: int, op: str, b: int) -> dict:
        return {"prompt": question.format(a=a, op=op, b=b), "answer": str(_OPS[op](a, b))}

    train = [row(*p) for p in rest[:num_train]]
    while len(train) < num_train:
        train.append(row(*rng.choice(rest)))
    return train, [row(*p) for p in held]


COUNTDOWN_QUESTION = (
    "Using the numbers {numbers}, create an equation that equals {target}. You can use basic "
    "arithmetic operations (+, -, *, /) and each number at most once. Show your work in "
    "<think> </think> tags and return the final equation in <answer> </answer> tags, "
    "for example <answer> (1 + 2) / 3 </answer>."
)


def _random_solvable(rng: random.Random, count: int, max_number: int, max_target: int):
    while True:
        numbers = [rng.randint(1, max_number) for _ in range(count)]
        order = numbers[:]
        rng.shuffle(order)
        value = Fraction(order[0])
        for n in order[1:]:
            op = rng.choice("+-*/")
            if op == "+":
                value += n
            elif op == "-":
                value -= n
            elif op == "*":
                value *= n
            else:
                value /= n
        if value.denominator == 1 and 1 <= value <= max_target:
            return numbers, int(value)


def countdown_rows(
    *,
    num_train: int,
    num_eval: int,
    seed: int = 0,
    count: int = 3,
    max_number: int = 20,
    max_target: int = 100,
) -> tuple[list[dict], list[dict]]:
    """Countdown problems that have at least one solution (built by composing the numbers)."""
    rng = random.Random(seed)
    seen: set[tuple] = set()
    rows: list[dict] = []
    attempts = 0
    while len(rows) < num_train + num_eval:
        attempts += 1
        if attempts > 100 * (num_train + num_eval):
            raise ValueError(
                "data.task_kwargs: too few distinct countdown problems for the split sizes"
            )
        numbers, target = _random_solvable(rng, count, max_number, max_target)
        key = (tuple(sorted(numbers)), target)
        if key in seen:
            continue
        seen.add(key)
        rows.append(
            {
                "prompt": COUNTDOWN_QUESTION.format(numbers=numbers, target=target),
                "answer": str(target),
                "numbers": numbers,
                "target": target,
            }
        )
    return rows[num_eval:], rows[:num_eval]


def calc_tool_rows(
    *,
    num_train: int,
    num_eval: int,
    seed: int = 0,
    ops: list[str] | None = None,
    digits: int = 3,
    digits_b: int = 2,
    question: str = "What is {a} {op} {b}?",
) -> tuple[list[dict], list[dict]]:
    """Multi-digit problems ``a op b`` (``a`` of ``digits`` digits, ``b`` of ``digits_b``) for
    the calculator tool (``env.name=calculator``, docs/environments.md): products a small model
    gets wrong alone but can copy from ``<result>`` once it calls the tool.

    The problems are drawn at random (the space of 3 x 2-digit products is large): the held-out
    split takes the first ``num_eval`` distinct ones, the train split only problems outside it.
    """
    ops = ops or ["*"]
    _check_ops(ops)
    for name, value in (("digits", digits), ("digits_b", digits_b)):
        if not 1 <= value <= 9:
            raise ValueError(f"data.task_kwargs.{name}={value}: must be in 1..9")
    size = len(ops) * 9 * 10 ** (digits - 1) * 9 * 10 ** (digits_b - 1)
    if num_eval >= size // 2:
        raise ValueError(
            f"data.num_eval={num_eval}: the task has only {size} distinct problems; "
            "take fewer held-out rows or more digits"
        )
    rng = random.Random(seed)

    def draw() -> tuple[int, str, int]:
        a = rng.randint(10 ** (digits - 1), 10**digits - 1)
        b = rng.randint(10 ** (digits_b - 1), 10**digits_b - 1)
        return a, rng.choice(ops), b

    held: dict[tuple, None] = {}  # insertion-ordered set
    while len(held) < num_eval:
        held[draw()] = None
    train = []
    while len(train) < num_train:
        p = draw()
        if p not in held:
            train.append(p)

    def row(a: int, op: str, b: int) -> dict:
        return {"prompt": question.format(a=a, op=op, b=b), "answer": str(_OPS[op](a, b))}

    return [row(*p) for p in train], [row(*p) for p in held]


def _shapes_rows(**kwargs) -> tuple[list[dict], list[dict]]:

    return shapes_rows(**kwargs)


TASKS = {
    "arithmetic": arithmetic_rows,
    "countdown": countdown_rows,
    "shapes": _shapes_rows,
    "calc_tool": calc_tool_rows,
    "code_fn": code_fn_rows,
}


def task_rows(
    name: str, *, num_train: int, num_eval: int, seed: int, **kwargs
) -> tuple[list[dict], list[dict]]:
    """A built-in task's (train, held-out) rows; ``reasoning_gym:<task>`` is reasoning-gym's."""
    if is_verifiers_task(name):
        return verifiers_rows(name, num_train=num_train, num_eval=num_eval, seed=seed, **kwargs)
    if is_reasoning_gym(name):
        task = name.partition(":")[2]
        return reasoning_gym_rows(task, num_train=num_train, num_eval=num_eval, seed=seed, **kwargs)
    if name not in TASKS:
        raise ValueError(f"unknown built-in task {name!r}; known: {', '.join(TASKS)}")
    try:
        return TASKS[name](num_train=num_train, num_eval=num_eval, seed=seed, **kwargs)
    except TypeError as exc:
        raise ValueError(f"data.task_kwargs for task {name!r}: {exc}") from None


DEFAULT_REWARD = {
    "arithmetic": "math",
    "countdown": "countdown",
    "shapes": "math",
    "calc_tool": "math",
    "code_fn": "code",
}


def default_reward(task: str) -> str:
    """The reward a task is graded with when reward.specs is empty."""
    return "reasoning_gym" if is_reasoning_gym(task) else DEFAULT_REWARD.get(task, "math")
