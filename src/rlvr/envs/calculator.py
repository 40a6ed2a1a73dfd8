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


def calculate(expression: str) -> str:
    """The value of ``expression`` as text (an integer, or a fraction p/q), or 'error: ...'."""
    try:
        value = evaluate(parse_arithmetic(expression.strip()))
    except (ArithmeticSyntaxError, ZeroDivisionError) as exc:
        return f"error: {exc}"
    return str(value.numerator) if value.denominator == 1 else f"{value}"


class CalculatorEnv(ToolEnv):
    """Calculator tool calls until the model answers without one."""

    tag, result_tag, instructions_text = "calc", "result", INSTRUCTIONS

    def call(self, argument: str) -> tuple[str, bool]:
        result = calculate(argument)
        return result, not result.startswith("error")
