"""A calculator tool: the model writes ``<calc>EXPRESSION</calc>``, the environment answers
``<result>VALUE</result>``; a turn without a call ends the episode, and the reward specs grade
that final turn (the row's answer, e.g. data.task=arithmetic or calc_tool).

The expression is parsed by the safe integer-arithmetic parser of the rewards
(``rlvr.rewards.arith``: + - * / and parentheses, bounded size, exact fractions), never
evaluated as Python.
"""

from __future__ import annotations

from rlvr.envs.base import ToolEnv
from rlvr.rewards.arith import ArithmeticSyntaxError, evaluate, parse_arithmetic

INSTRUCTIONS = (
    "You may use a calculator: write <calc>expression</calc> (numbers, + - * / and parentheses) "
    "and the result comes back as <result>value</result>. Give the final answer as a number."
)

# Worked examples (question, expression) that ``few_shot`` shows before the question, in the
# question form of data.task=arithmetic and calc_tool.
EXAMPLES = (("What is 12 * 34?", "12 * 34"), ("What is 507 * 86?", "507 * 86"))


def calculate(expression: str) -> str:
    """The value of ``expression`` as text (an integer, or a fraction p/q), or 'error: ...'."""
    try:
        value = evaluate(parse_arithmetic(expression.strip()))
    except (ArithmeticSyntaxError, ZeroDivisionError) as exc:
        return f"error: {exc}"
    return str(value.numerator) if value.denominator == 1 else f"{value}"


class CalculatorEnv(ToolEnv):
    """Calculator tool calls until the model answers without one.

    ``few_shot`` > 0: the prompt is a conversation that first shows that many worked examples
    (question, ``<calc>`` call, ``<result>``, "The answer is N."), the tool format by example
    rather than by instructions; a small model imitates an example's turns far more readily
    than it follows a description of them (docs/environments.md, "The calc_tool task").
    """

    tag, result_tag, instructions_text = "calc", "result", INSTRUCTIONS

    def __init__(self, instructions: bool = True, few_shot: int = 0) -> None:
        super().__init__(instructions)
        if isinstance(few_shot, bool) or not 0 <= few_shot <= len(EXAMPLES):
            raise ValueError(f"env.kwargs.few_shot={few_shot!r}: must be in 0..{len(EXAMPLES)}")
        self.few_shot = few_shot

    def reset(self, row: dict) -> str | list[dict]:
        question = super().reset(row)
        if not self.few_shot:
            return question
        messages: list[dict] = []
        for example, expression in EXAMPLES[: self.few_shot]:
            value = calculate(expression)
            messages += [
                {"role": "user", "content": super().reset({"prompt": example})},
                {"role": "assistant", "content": f"<calc>{expression}</calc>"},
                {"role": self.observation_role, "content": f"<result>{value}</result>"},
                {"role": "assistant", "content": f"The answer is {value}."},
            ]
        return [*messages, {"role": "user", "content": question}]

    def call(self, argument: str) -> tuple[str, bool]:
        result = calculate(argument)
        return result, not result.startswith("error")
