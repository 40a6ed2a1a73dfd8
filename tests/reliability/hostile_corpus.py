"""A generated corpus of hostile model responses aimed at the graders and parsers.

``build_corpus(canary, seed=0)`` returns at least 300 ``HostileCase``s in seven categories:

- ``huge_numbers``  exponent towers, huge powers and factorials, literals of 10^5 digits
- ``nesting``       braces, brackets, ``\\frac`` / ``\\sqrt`` / ``\\left(`` nested up to 10^5 deep
- ``huge_strings``  1-2 MB strings built from the patterns that make parsers quadratic
- ``bad_text``      invalid UTF-8 (decoded with surrogateescape / replace / latin-1), control
                    characters, NUL, BOM, bidi overrides, zero-width and combining characters
- ``code``          Python and shell code in ``\\boxed{}``, ``\\text{}``, ``<answer>`` and as
                    Countdown equations; every payload would create ``canary`` if it ever ran
- ``unbalanced``    unclosed boxes and groups, stray closers, broken environments and tags
- ``harmony``       gpt-oss Harmony fragments: missing final channel, torn headers, floods

``build_giant_cases(canary)`` adds the 10 MB strings of the slow tier.

A case may state the score a correct grader must give (``expect_math``, ``expect_countdown``)
when the construction makes it certain, e.g. a right answer behind a megabyte of noise; None
means only "graded without failure, fast, nothing executed". Math references are short and
plain; every Countdown case uses the numbers [3, 4, 4, 6] and target 24, so its expected scores
can be checked by hand: (4 + 4) * 3 = 24 is right, 3 / (4 - 4) divides by zero.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

CATEGORIES = (
    "huge_numbers",
    "nesting",
    "huge_strings",
    "bad_text",
    "code",
    "unbalanced",
    "harmony",
)
COUNTDOWN_NUMBERS = [3, 4, 4, 6]
COUNTDOWN_TARGET = 24
COUNTDOWN_SOLUTION = "(4 + 4) * 3"  # 8 * 3 = 24, each number used at most as often as given
MB = 1_000_000


@dataclass(frozen=True)
class HostileCase:
    """One response to grade. ``reference`` is the maths reference answer."""

    category: str
    name: str
    response: str
    reference: str = "5"
    expect_math: float | None = None
    expect_countdown: float | None = None

    @property
    def row(self) -> dict:
        """The dataset row a Countdown reward reads."""
        return {"numbers": list(COUNTDOWN_NUMBERS), "target": COUNTDOWN_TARGET}


def _huge_numbers(rng: random.Random) -> list[HostileCase]:
    fixed = [
        r"9^{9^{9^{9}}}",
        r"10^{10^{10}}",
        r"10**10**10",
        r"2^{2^{2^{2^{2^{2}}}}}",
        r"(10!)!",
        r"1000000!",
        r"9!!!!!!!!",
        r"\left(10^{100}\right)!",
        r"10^{10^{-10^{10}}}",
        r"e^{e^{e^{e^{100}}}}",
        r"\exp(\exp(\exp(100)))",
        r"\binom{10^{9}}{10^{8}}",
        r"\sum_{k=1}^{10^{12}} k^{k}",
        r"\prod_{k=1}^{10^{9}} k",
        r"1e999999999",
        r"1.5e308 \cdot 10^{308}",
        r"\frac{1}{0}",
        r"0^{-1}",
        r"\sqrt{-1}^{10^{10}}",
        r"x^{x^{x^{x}}}",
        r"\infty^{\infty}",
        r"(x+1)^{100000}",
        r"\lim_{n\to\infty} n^{n^{n}}",
        r"\underbrace{9^{9^{\cdots^{9}}}}_{9}",
        r"\gamma(10^{10})",
        r"\Gamma(10^{10})",
        r"10\uparrow\uparrow 10",
    ]
    out = [
        HostileCase("huge_numbers", f"fixed_{i}", rf"The answer is \boxed{{{ans}}}.")
        for i, ans in enumerate(fixed)
    ]
    for i in range(20):  # random towers and powers
        height = rng.randint(2, 8)
        base = rng.choice(["2", "9", "10", "99", "x", "1.0001"])
        tower = base
        for _ in range(height):
            tower = f"{rng.randint(2, 999)}^{{{tower}}}"
        out.append(HostileCase("huge_numbers", f"tower_{i}", rf"\boxed{{{tower}}}"))
    for i in range(8):  # literals of 10^3 .. 10^5 digits, boxed or as the last number
        digits = "".join(rng.choice("0123456789") for _ in range(10 ** rng.randint(3, 5)))
        text = rf"\boxed{{{digits}}}" if i % 2 else f"so the result is {digits}"
        out.append(HostileCase("huge_numbers", f"literal_{i}", text))
    for i in range(5):  # factorial chains
        out.append(
            HostileCase(
                "huge_numbers",
                f"factorial_{i}",
                rf"\boxed{{({rng.randint(100, 10**6)}!)" + "!" * rng.randint(1, 5) + "}",
            )
        )
    return out


def _nesting(rng: random.Random) -> list[HostileCase]:
    out = []
    for depth in (30, 300, 3000, 30_000, 100_000):
        out += [
            HostileCase(
                "nesting", f"braces_{depth}", r"\boxed{" + "{" * depth + "5" + "}" * depth + "}"
            ),
            HostileCase(
                "nesting", f"parens_{depth}", r"\boxed{" + "(" * depth + "5" + ")" * depth + "}"
            ),
            HostileCase("nesting", f"brackets_{depth}", "[" * depth + "5" + "]" * depth),
            HostileCase(
                "nesting",
                f"frac_{depth}",
                r"\boxed{"
                + r"\frac{1}{" * min(depth, 20_000)
                + "2"
                + "}" * min(depth, 20_000)
                + "}",
            ),
            HostileCase(
                "nesting",
                f"sqrt_{depth}",
                r"\boxed{" + r"\sqrt{" * min(depth, 20_000) + "4" + "}" * min(depth, 20_000) + "}",
            ),
            HostileCase(
                "nesting",
                f"left_{depth}",
                r"\boxed{" + r"\left(" * depth + "5" + r"\right)" * depth + "}",
            ),
            HostileCase(
                "nesting",
                f"boxes_{depth}",
                r"\boxed{" * min(depth, 20_000) + "5" + "}" * min(depth, 20_000),
            ),
            # The Countdown parser accepts up to 50 levels of parentheses: ((((4+4))))*3 is
            # right at depth 30 and refused (0.0) beyond.
            HostileCase(
                "nesting",
                f"countdown_parens_{depth}",
                "<answer>" + "(" * depth + "4+4" + ")" * depth + "*3</answer>",
                expect_countdown=1.0 if depth < 50 else 0.0,
            ),
        ]
    for i in range(5):  # random mixes of openers and closers
        depth = rng.randint(50, 5000)
        opens = "".join(rng.choice("{([") for _ in range(depth))
        closes = "".join({"{": "}", "(": ")", "[": "]"}[c] for c in reversed(opens))
        out.append(HostileCase("nesting", f"mixed_{i}", rf"\boxed{{{opens}5{closes}}}"))
    # Shallow nesting around the right answer must still be graded right: {{5}} is 5.
    out.append(HostileCase("nesting", "shallow_right", r"\boxed{{5}}", expect_math=1.0))
    return out


_QUADRATIC_PATTERNS = (
    "\\boxed{",
    "{",
    "}",
    "\\boxed",
    "<answer>",
    "</answer>",
    "<answer></answer>",
    "####",
    "#### \n",
    "1,",
    "1.",
    "-",
    "\\",
    "$",
    "\\frac{",
    "<|channel|>",
    "<|channel|>final",
    "<|message|>",
    "=1",
    " ",
    "\n",
    "7",
)


def _huge_strings(rng: random.Random) -> list[HostileCase]:
    out = []
    for i, pattern in enumerate(_QUADRATIC_PATTERNS):
        size = rng.choice([1, 2]) * MB
        out.append(HostileCase("huge_strings", f"repeat_{i}", pattern * (size // len(pattern))))
    noise = "lorem ipsum dolor sit amet " * (MB // 27)
    out += [
        # the right answer after a megabyte of words, of braces, of numbers
        HostileCase("huge_strings", "noise_then_box", noise + r"\boxed{5}", expect_math=1.0),
        HostileCase("huge_strings", "braces_then_box", "{" * MB + r" \boxed{5}", expect_math=1.0),
        HostileCase(
            "huge_strings",
            "numbers_then_answer",
            "1 2 3 " * (MB // 6) + f"<answer>{COUNTDOWN_SOLUTION}</answer>",
            expect_countdown=1.0,
        ),
        # a megabyte inside the box is not an answer
        HostileCase(
            "huge_strings", "box_of_a_megabyte", r"\boxed{" + "5" * MB + "}", expect_math=0.0
        ),
        HostileCase(
            "huge_strings",
            "answer_tag_of_a_megabyte",
            "<answer>" + "3+" * (MB // 2) + "3</answer>",
            expect_countdown=0.0,
        ),
    ]
    return out


def _bad_text(rng: random.Random) -> list[HostileCase]:
    out = []
    for i in range(12):  # random bytes, decoded three ways a bad detokeniser might
        raw = bytes(rng.randrange(256) for _ in range(rng.randint(10, 5000)))
        for how in ("surrogateescape", "replace", "latin-1"):
            text = raw.decode("latin-1") if how == "latin-1" else raw.decode("utf-8", errors=how)
            out.append(HostileCase("bad_text", f"bytes_{i}_{how}", text))
    controls = "".join(chr(c) for c in list(range(32)) + [127])
    specials = {
        "nul_in_box": "\\boxed{5\x00}",
        "nul_everywhere": "\x00".join(r"\boxed{5}"),
        "controls": controls * 100 + r"\boxed{5}",
        "bom": "\ufeff" + r"\boxed{5}",
        "bidi_override": "\u202e" + r"\boxed{5}" + "\u202c",
        "zero_width": "\u200b".join(r"\boxed{5}"),
        "combining": "5" + "\u0301" * 50_000,
        "lone_high_surrogate": "\ud800" + r"\boxed{5}",
        "lone_low_surrogate": r"\boxed{5\udfff}",
        "surrogate_pair_halves": "\ud83d" * 1000 + "\ude00" * 1000,
        "replacement_chars": "\ufffd" * 10_000,
        "private_use": "\ue000\uf8ff" * 1000,
        "non_characters": "\uffff\ufffe" * 1000,
        "fullwidth_digits": r"\boxed{５}",
        "arabic_digits": r"\boxed{٥}",
        "line_separators": "\u2028\u2029\u0085" * 1000 + r"\boxed{5}",
        "emoji": "🤖" * 10_000 + r"\boxed{5}",
        "escape_sequences": "\x1b[2J\x1b[31m" * 1000 + r"\boxed{5}",
        "backspaces": r"\boxed{5}" + "\b" * 1000 + r"\boxed{6}",
        "carriage_returns": "\r" * 10_000 + "<answer>(4 + 4) * 3</answer>",
        "tabs_in_equation": "<answer>(4\t+\t4)\t*\t3</answer>",
        "nul_in_equation": "<answer>(4 + 4) * 3\x00</answer>",
        "unicode_minus": "<answer>(4 + 4) * (6 − 3)</answer>",
        "unicode_times": "<answer>(4 + 4) × 3</answer>",
    }
    out += [HostileCase("bad_text", name, text) for name, text in specials.items()]
    # Noise around a clean answer must not hide it.
    out += [
        HostileCase("bad_text", "bom_right", "\ufeff" + r"\boxed{5}", expect_math=1.0),
        HostileCase("bad_text", "controls_right", controls * 100 + r" \boxed{5}", expect_math=1.0),
        HostileCase(
            "bad_text",
            "emoji_right_countdown",
            "🤖" * 100 + f"<answer>{COUNTDOWN_SOLUTION}</answer>",
            expect_countdown=1.0,
        ),
        HostileCase(
            "bad_text",
            "times_sign_countdown",
            "<answer>(4 + 4) × 3</answer>",
            expect_countdown=1.0,
        ),
    ]
    return out


def spelled(path: Path) -> str:
    """``path`` as Python that builds it from ``chr()`` calls: no quotes, underscores or keywords,
    so a payload using it passes the maths grader's forbidden-word screen and reaches the
    symbolic parser."""
    return "+".join(f"chr({ord(ch)})" for ch in str(path))


def _code(canary: Path, rng: random.Random) -> list[HostileCase]:
    c = str(canary)
    by_chr = spelled(canary)
    python = [
        f"__import__('os').system('touch {c}')",
        f"open('{c}', 'w').write('x')",
        f"open({by_chr},chr(119))",
        f"exec(\"open('{c}','w')\")",
        f"eval(\"open('{c}','w')\")",
        f"(lambda: open('{c}', 'w'))()",
        f"[c for c in ().__class__.__base__.__subclasses__()][0]('{c}')",
        f"import os; os.system('touch {c}')",
        f"compile(\"open('{c}','w')\", 'x', 'exec')",
        f"getattr(__builtins__, 'open')('{c}', 'w')",
        f"Symbol(open({by_chr},chr(119)))",
        f"S(open({by_chr},chr(119)))",
        f"Function(open({by_chr},chr(119)))(x)",
        f"sympify(open({by_chr},chr(119)))",
        f"Integer(len(open({by_chr},chr(119)).name))",
    ]
    shell = [
        f"$(touch {c})",
        f"`touch {c}`",
        f"; touch {c}",
        f"&& touch {c}",
        f"| tee {c}",
        f"> {c}",
        f"5; touch {c} #",
        f"\\immediate\\write18{{touch {c}}}",
        f"\\input{{{c}}}",
        f"\\openout1={c}",
    ]
    out = []
    for i, code in enumerate(python + shell):
        wrapped = {
            "boxed": rf"\boxed{{{code}}}",
            "text": rf"\boxed{{\text{{{code}}}}}",
            "mathrm": rf"\boxed{{\mathrm{{{code}}}}}",
            "answer_tag": f"<answer>{code}</answer>",
            "gsm8k": f"#### {code}",
            "countdown_mixed": f"<answer>(4 + 4) * {code}</answer>",
            "last_line": f"reasoning...\n{code}",
        }
        for where, text in wrapped.items():
            out.append(HostileCase("code", f"code_{i}_{where}", text, expect_countdown=0.0))
    # Payloads spelled as arithmetic-looking text that the Countdown parser must refuse.
    for i in range(5):
        junk = rng.choice(["**", "//", "%", "<<", "^", "e", "j", "_", "0x"])
        out.append(
            HostileCase(
                "code",
                f"countdown_operator_{i}",
                f"<answer>4 {junk} 4 * 3</answer>",
                expect_countdown=0.0,
            )
        )
    return out


def _unbalanced(rng: random.Random) -> list[HostileCase]:
    fixed = {
        "unclosed_box": r"\boxed{5",
        "unclosed_box_after_right": r"\boxed{5} and then \boxed{6",
        "stray_closers": "}}}}} \\boxed{5}}}}} }}}",
        "box_without_brace": r"\boxed 5",
        "box_empty": r"\boxed{}",
        "box_spaces": r"\boxed{   }",
        "fbox_unclosed": r"\fbox{5",
        "frac_unclosed": r"\boxed{\frac{1}{",
        "sqrt_unclosed": r"\boxed{\sqrt{\frac{1}{2}}",
        "left_without_right": r"\boxed{\left(5}",
        "right_without_left": r"\boxed{5\right)}",
        "begin_without_end": r"\boxed{\begin{pmatrix}1&2\\3&4}",
        "end_without_begin": r"\boxed{1&2\end{pmatrix}}",
        "dollar_unbalanced": r"$\boxed{5}",
        "dollars_only": "$$$$$$$$$",
        "answer_close_only": "5</answer>",
        "answer_open_only": "<answer>5",
        "answer_nested": "<answer><answer>5</answer></answer>",
        "answer_reversed": "</answer>5<answer>",
        "gsm8k_empty": "####",
        "gsm8k_no_value": "#### \n#### ",
        "backslash_end": "\\",
        "command_soup": r"\boxed{\\\\\\\frac\sqrt\left\right}",
        "percent_comment": r"\boxed{5 % }",
        "braces_interleaved": r"\boxed{[}(]{)}",
        "text_unclosed": r"\boxed{\text{5}",
        "math_env_unclosed": r"\[ \boxed{5",
        "answer_with_equals_only": "<answer>=</answer>",
        "answer_result_only": "<answer>= 24</answer>",
        "countdown_unclosed_paren": "<answer>(4 + 4 * 3</answer>",
        "countdown_extra_paren": "<answer>(4 + 4)) * 3</answer>",
        "countdown_trailing_operator": "<answer>4 + 4 *</answer>",
        "countdown_unary_minus": "<answer>-3 + 4 * 6</answer>",
        "countdown_decimal": "<answer>4.0 * 6</answer>",
    }
    out = [HostileCase("unbalanced", name, text) for name, text in fixed.items()]
    alphabet = [
        "\\boxed{",
        "{",
        "}",
        "(",
        ")",
        "[",
        "]",
        "\\frac",
        "5",
        "<answer>",
        "</answer>",
        "$",
    ]
    for i in range(10):  # random markup soup
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(5, 400)))
        out.append(HostileCase("unbalanced", f"soup_{i}", text))
    # Cases with a certain score, checked by hand:
    out += [
        # the last box never closes, so the earlier complete \boxed{5} is the answer
        HostileCase(
            "unbalanced", "earlier_box_counts", r"\boxed{5} wait \boxed{6", expect_math=1.0
        ),
        # 3 / (4 - 4) divides by zero: well formed and allowed numbers, so the format score 0.1
        HostileCase(
            "unbalanced",
            "division_by_zero_format",
            "<answer>3 / (4 - 4)</answer>",
            expect_countdown=0.1,
        ),
        # a number used twice that was given once: 0.0, not the format score
        HostileCase(
            "unbalanced", "number_reused", "<answer>(3 + 3) * 4</answer>", expect_countdown=0.0
        ),
        HostileCase(
            "unbalanced",
            "right_after_stray_closers",
            f"}}}}}} )) <answer>{COUNTDOWN_SOLUTION}</answer>",
            expect_countdown=1.0,
        ),
    ]
    return out


def _harmony(rng: random.Random) -> list[HostileCase]:
    analysis = "<|channel|>analysis<|message|>"
    final = "<|channel|>final<|message|>"
    fixed = {
        "analysis_only": analysis + r"thinking \boxed{5}",
        "final_without_message": r"<|channel|>final \boxed{5}",
        "message_without_channel": r"<|message|>\boxed{5}",
        "start_only": "<|start|>" * 1000,
        "end_before_final": analysis + r"x<|end|>" + "<|channel|>final",
        "final_then_garbage": final + r"\boxed{5}<|return|>" + "<|channel|>" * 1000,
        "constrain_junk": "<|channel|>final<|constrain|>" + "<" * 1000 + "<|message|>5",
        "nested_final": final + final + final + r"\boxed{5}",
        "flood_analysis": (analysis + "hmm ") * 20_000,
        "flood_final_headers": "<|channel|>final" * 20_000 + "<|message|>",
        "torn_marker": "<|chan" + r"nel|>final<|message|>\boxed{5}",
        "markers_in_box": r"\boxed{<|channel|>final<|message|>5}",
        "call_channel": "<|channel|>commentary to=python<|message|>import os<|call|>",
        "return_without_final": r"<|return|>\boxed{5}",
    }
    out = [HostileCase("harmony", name, text) for name, text in fixed.items()]
    pieces = ["<|start|>", "<|channel|>", "final", "analysis", "<|message|>", "<|end|>", "<|return|>",
              "<|constrain|>", "\\boxed{5}", "5", "json"]  # fmt: skip
    for i in range(20):  # random fragment sequences
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(3, 60)))
        out.append(HostileCase("harmony", f"fragments_{i}", text))
    # With a final message the answer is read from it, however much analysis came first; with
    # only analysis there is no answer (the run was cut off while thinking).
    out += [
        HostileCase(
            "harmony",
            "final_after_long_analysis",
            analysis + r"\boxed{6} " * 10_000 + "<|end|>" + final + r"\boxed{5}<|return|>",
            expect_math=1.0,
        ),
        HostileCase("harmony", "analysis_only_right", analysis + r"\boxed{5}", expect_math=0.0),
        HostileCase(
            "harmony",
            "final_countdown",
            analysis + "no<|end|>" + final + f"<answer>{COUNTDOWN_SOLUTION}</answer><|return|>",
            expect_countdown=1.0,
        ),
    ]
    return out


def build_corpus(canary: Path, seed: int = 0) -> list[HostileCase]:
    """The default-tier corpus (>= 300 cases, the largest strings 2 MB)."""
    rng = random.Random(seed)
    return [
        *_huge_numbers(rng),
        *_nesting(rng),
        *_huge_strings(rng),
        *_bad_text(rng),
        *_code(canary, rng),
        *_unbalanced(rng),
        *_harmony(rng),
    ]


def build_giant_cases(canary: Path) -> list[HostileCase]:
    """10 MB responses for the slow tier (same patterns, five to ten times longer)."""
    ten = 10 * MB
    c = str(canary)
    return [
        HostileCase("huge_strings", "giant_open_boxes", "\\boxed{" * (ten // 7)),
        HostileCase("huge_strings", "giant_braces", "{" * (ten // 2) + "}" * (ten // 2)),
        HostileCase("huge_strings", "giant_answer_tags", "<answer>" * (ten // 8)),
        HostileCase("huge_strings", "giant_digits", "7" * ten),
        HostileCase(
            "huge_strings",
            "giant_noise_then_box",
            "x " * (ten // 2) + r"\boxed{5}",
            expect_math=1.0,
        ),
        HostileCase(
            "huge_strings",
            "giant_code_in_box",
            r"\boxed{" + f"__import__('os').system('touch {c}')" * (ten // 60) + "}",
            expect_math=0.0,
        ),
    ]
