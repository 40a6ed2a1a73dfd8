"""A small, safe parser for integer arithmetic: ``+ - * /``, parentheses, nothing else.

Grammar (binary operators only; no unary minus, no decimals, no exponent)::

    expr   := term (("+" | "-") term)*
    term   := factor (("*" | "/") factor)*
    factor := INTEGER | "(" expr ")"

The text is tokenised first (any other character is an error), then parsed by
recursive descent into a tree whose depth, length and token count are capped, so no
input can exhaust the stack or take long. Evaluation uses exact ``Fraction``s; division
by zero raises ``ZeroDivisionError``. Nothing is ever passed to ``eval``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

__all__ = [
    "ArithmeticSyntaxError",
    "Expr",
    "Num",
    "BinOp",
    "evaluate",
    "literals",
    "parse_arithmetic",
]

MAX_CHARS = 1000
MAX_TOKENS = 200
MAX_DEPTH = 50
MAX_DIGITS = 12
_TOKEN_RE = re.compile(r"\s*(?:(\d+)|([-+*/()]))")


class ArithmeticSyntaxError(ValueError):
    """The text is not a well-formed expression of the grammar above."""


@dataclass(frozen=True)
class Num:
    value: int


@dataclass(frozen=True)
class BinOp:
    op: str
    left: Expr
    right: Expr


Expr = Num | BinOp


def _tokenize(text: str) -> list[str]:
    if len(text) > MAX_CHARS:
        raise ArithmeticSyntaxError(f"expression longer than {MAX_CHARS} characters")
    tokens: list[str] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        found = _TOKEN_RE.match(text, pos)
        if found is None:
            raise ArithmeticSyntaxError(f"unexpected character {text[pos:].lstrip()[:1]!r}")
        number, symbol = found.groups()
        if number is not None and len(number) > MAX_DIGITS:
            raise ArithmeticSyntaxError(f"number with more than {MAX_DIGITS} digits")
        tokens.append(number if number is not None else symbol)
        if len(tokens) > MAX_TOKENS:
            raise ArithmeticSyntaxError(f"more than {MAX_TOKENS} tokens")
        pos = found.end()
    if not tokens:
        raise ArithmeticSyntaxError("empty expression")
    return tokens


class _Parser:
    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise ArithmeticSyntaxError("expression ends too early")
        self.pos += 1
        return token

    def expr(self, depth: int) -> Expr:
        node = self.term(depth)
        while self.peek() in ("+", "-"):
            op = self.take()
            node = BinOp(op, node, self.term(depth))
        return node

    def term(self, depth: int) -> Expr:
        node = self.factor(depth)
        while self.peek() in ("*", "/"):
            op = self.take()
            node = BinOp(op, node, self.factor(depth))
        return node

    def factor(self, depth: int) -> Expr:
        token = self.take()
        if token.isdigit():
            return Num(int(token))
        if token == "(":
            if depth >= MAX_DEPTH:
                raise ArithmeticSyntaxError(f"parentheses nested deeper than {MAX_DEPTH}")
            node = self.expr(depth + 1)
            if self.take() != ")":
                raise ArithmeticSyntaxError("missing ')'")
            return node
        raise ArithmeticSyntaxError(f"expected a number or '(', got {token!r}")


def parse_arithmetic(text: str) -> Expr:
    """Parse ``text`` into a tree; raises ArithmeticSyntaxError naming the problem."""
    parser = _Parser(_tokenize(text))
    tree = parser.expr(0)
    if parser.peek() is not None:
        raise ArithmeticSyntaxError(f"unexpected {parser.peek()!r} after a complete expression")
    return tree


def evaluate(tree: Expr) -> Fraction:
    """Exact value of ``tree``; raises ZeroDivisionError on division by zero."""
    if isinstance(tree, Num):
        return Fraction(tree.value)
    left, right = evaluate(tree.left), evaluate(tree.right)
    if tree.op == "+":
        return left + right
    if tree.op == "-":
        return left - right
    if tree.op == "*":
        return left * right
    return left / right


def literals(tree: Expr) -> list[int]:
    """The integer literals of ``tree``, left to right."""
    if isinstance(tree, Num):
        return [tree.value]
    return literals(tree.left) + literals(tree.right)
