"""The ``code`` reward: the model's program, run against the row's tests in the sandbox.

The program is the reply's last fenced code block (```python, ```py or a bare ```); a row with
``code_prefix`` (HumanEval's function header and docstring) puts it before the block, or, when
the reply has no block, before the whole reply (a completion of the prompt). No program: score
0 and info ``code_no_program``.

A row's ``tests`` (docs/data.md has the schema and an example row) holds any mix of:

- assert-style tests, ``"assert f(2) == 4"`` or ``{"assert": ...}``: code run after the
  program in its namespace (HumanEval's ``check(candidate)`` is one such test); it passes when
  it raises nothing;
- call tests, ``{"call": "f(2)", "expected": 4}``: the expression's value, sent out of the
  sandbox as JSON and compared there with ``expected`` as JSON text (so 4 and 4.0 differ, a
  tuple equals a list, and no object of the program's can claim to be equal to anything);
- stdin/stdout tests, ``{"stdin": "2\\n", "stdout": "4\\n"}``: the program run as a script with
  that input; it passes when it exits 0 and its output equals the expected one after
  normalisation: line endings to ``\\n``, trailing spaces of each line and trailing blank lines
  dropped (leading spaces and inner blank lines kept).

Cost decides the runs: the assert and call tests of a row share one sandbox run (a harness,
`code_harness`, reports each test on its own line under a marker the program never sees), since
a sandbox start costs more than most tests; each stdin/stdout test is its own run (its own
input). All-or-nothing stops at the first failed run; ``fraction=True`` runs every test and
scores the fraction passed. The runs of a sample share ``timeout_s`` of wall time, each taking
an equal share of what is left, so a hang ends its own run and the sample, never the batch.

Info (floats): ``correct`` (every test passed), ``code_pass_frac`` (all-or-nothing: of the tests
run before the first failed run), ``code_no_program``, and why
a sample failed beyond wrong answers: ``code_timeout`` (a run hit its time limit),
``code_limit`` (memory, processes, files, write or output: `TestReport.limits` names it),
``code_error`` (the program did not load, or a script exited non-zero).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.rewards.base import RewardResult
from rlvr.sandbox import Limits, Result, Sandbox, default_limits, require_sandbox

__all__ = [
    "CodeTest",
    "TestReport",
    "extract_program",
    "make_code",
    "normalise_output",
    "parse_tests",
    "program_of",
    "run_tests",
]

HARNESS = Path(__file__).with_name("code_harness.py").read_text()
# a fenced block: ``` or ```python / ```py / ```python3, closed by ``` on its own line
_FENCE_RE = re.compile(
    r"^[ \t]*```[ \t]*(?P<lang>[A-Za-z0-9_+-]*)[ \t]*\n(?P<body>.*?)^[ \t]*```[ \t]*$",
    re.DOTALL | re.MULTILINE,
)
_PYTHON_TAGS = ("", "python", "py", "python3")
_TIMEOUT_LIMITS = ("wall", "cpu")
# below this share of wall time a run is not started (it could not even start the interpreter)
_MIN_RUN_S = 0.05
_INFO_KEYS = (
    "correct",
    "code_pass_frac",
    "code_no_program",
    "code_timeout",
    "code_limit",
    "code_error",
)


@dataclass(frozen=True)
class CodeTest:
    """One test: ``kind`` is ``assert`` (``source``), ``call`` (``source``, ``expected``) or
    ``stdio`` (``stdin``, ``stdout``)."""

    kind: str
    source: str = ""
    expected: Any = None
    stdin: str = ""
    stdout: str = ""


@dataclass
class TestReport:
    """What running a row's tests gave: one bool per test, and why runs failed."""

    passed: list[bool]
    timeout: bool = False
    limits: set[str] = field(default_factory=set)
    error: bool = False
    runs: list[Result] = field(default_factory=list)


def extract_program(response: str) -> str | None:
    """The body of the reply's last closed fenced block tagged python/py/python3 or untagged,
    or None."""
    bodies = [
        m.group("body")
        for m in _FENCE_RE.finditer(response)
        if m.group("lang").lower() in _PYTHON_TAGS
    ]
    return bodies[-1] if bodies else None


def program_of(response: str, code_prefix: str | None = None) -> str | None:
    """The program to run: the last fenced block (after ``code_prefix`` when given), or with a
    ``code_prefix`` and no block, the prefix followed by the reply itself; None if neither."""
    block = extract_program(response)
    if code_prefix is None:
        return block
    if block is None:
        return code_prefix + response
    # a whole function redefines the prefix's (which holds only its docstring); a body alone
    # completes it. The prefix's imports and helpers stay in scope either way.
    return code_prefix + "\n" + block


def normalise_output(text: str) -> str:
    """Line endings to ``\\n``, each line's trailing whitespace and trailing blank lines
    dropped."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "\n".join(line.rstrip() for line in lines).rstrip("\n")


def parse_tests(tests: Any, where: str = "row") -> list[CodeTest]:
    """The row's ``tests`` as `CodeTest`s; ValueError naming the row field and item if bad."""
    if isinstance(tests, str) or not isinstance(tests, Sequence):
        raise ValueError(
            f"code reward: {where} field 'tests' must be a list of tests, got "
            f"{type(tests).__name__} (docs/data.md: the code reward's rows)"
        )
    if not tests:
        raise ValueError(f"code reward: {where} field 'tests' is empty")
    out = []
    for i, test in enumerate(tests):
        name = f"{where} field 'tests[{i}]'"
        if isinstance(test, str):
            test = {"assert": test}
        if not isinstance(test, dict):
            raise ValueError(
                f"code reward: {name} must be a string (assert-style) or an object, got "
                f"{type(test).__name__}"
            )
        keys = set(test)
        if keys == {"assert"}:
            out.append(CodeTest("assert", source=_text(test["assert"], name, "assert")))
        elif keys == {"call", "expected"}:
            expected = test["expected"]
            try:
                json.dumps(expected)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"code reward: {name}.expected is not JSON: {exc}") from None
            out.append(
                CodeTest("call", source=_text(test["call"], name, "call"), expected=expected)
            )
        elif keys == {"stdin", "stdout"}:
            out.append(
                CodeTest(
                    "stdio",
                    stdin=_text(test["stdin"], name, "stdin", empty_ok=True),
                    stdout=_text(test["stdout"], name, "stdout", empty_ok=True),
                )
            )
        else:
            raise ValueError(
                f"code reward: {name} has keys {sorted(keys)}; a test is a string or "
                "{'assert': code}, {'call': expression, 'expected': value} or "
                "{'stdin': text, 'stdout': text}"
            )
    return out


def _text(value: Any, name: str, key: str, empty_ok: bool = False) -> str:
    if not isinstance(value, str) or not (empty_ok or value.strip()):
        raise ValueError(
            f"code reward: {name}.{key} must be a {'' if empty_ok else 'non-empty '}string, "
            f"got {value!r:.80}"
        )
    return value


def run_tests(
    program: str,
    tests: list[CodeTest],
    sandbox: Sandbox,
    *,
    timeout_s: float,
    memory_mb: int | None = None,
    stop_at_failure: bool = True,
) -> TestReport:
    """Run ``tests`` against ``program`` in ``sandbox`` within ``timeout_s`` of wall time in
    all (see the module docstring); tests not run count as failed. Each run's other limits are
    the process's (``sandbox.*``: `rlvr.sandbox.default_limits`), memory ``memory_mb`` if given."""
    report = TestReport(passed=[False] * len(tests))
    in_process = [i for i, t in enumerate(tests) if t.kind != "stdio"]
    stdio = [i for i, t in enumerate(tests) if t.kind == "stdio"]
    runs_left = (1 if in_process else 0) + len(stdio)
    spent = 0.0

    def limits() -> Limits | None:
        share = (timeout_s - spent) / max(runs_left, 1)
        if share < _MIN_RUN_S:
            report.timeout = True
            return None
        mem = {} if memory_mb is None else {"memory_mb": memory_mb}
        return default_limits(wall_s=share, cpu_s=share, **mem)

    def note(res: Result) -> None:
        nonlocal spent, runs_left
        report.runs.append(res)
        spent += res.wall_s
        runs_left -= 1
        if res.timed_out or res.limit in _TIMEOUT_LIMITS:
            report.timeout = True
        elif res.limit is not None:
            report.limits.add(res.limit)

    if in_process:
        lim = limits()
        if lim is None:
            return report
        marker = secrets.token_hex(16)
        spec = [
            {"call": tests[i].source} if tests[i].kind == "call" else {"assert": tests[i].source}
            for i in in_process
        ]
        res = sandbox.run(
            ["python3", "harness.py"],
            files={"harness.py": HARNESS, "solution.py": program, "tests.json": json.dumps(spec)},
            stdin=marker + "\n",
            limits=lim,
        )
        note(res)
        lines = _reports(res.stdout, marker)
        if lines is None or -1 in lines:
            report.error = True
            lines = {}
        for j, i in enumerate(in_process):
            ok, detail = lines.get(j, (False, ""))
            if ok and tests[i].kind == "call":
                ok = detail == json.dumps(tests[i].expected, sort_keys=True)
            report.passed[i] = ok
        if len(lines) < len(in_process) and not report.timeout and not report.limits:
            report.error = True  # the program ended the harness before every test reported
        if stop_at_failure and not all(report.passed[i] for i in in_process):
            return report
    for i in stdio:
        lim = limits()
        if lim is None:
            return report
        res = sandbox.run(
            ["python3", "main.py"], files={"main.py": program}, stdin=tests[i].stdin, limits=lim
        )
        note(res)
        if res.returncode not in (0, None) and res.limit is None:
            report.error = True
        report.passed[i] = res.ok and normalise_output(res.stdout) == normalise_output(
            tests[i].stdout
        )
        if stop_at_failure and not report.passed[i]:
            return report
    return report


def _reports(stdout: str, marker: str) -> dict[int, tuple[bool, str]] | None:
    """The harness's lines by test index; None when an index is reported twice (a forgery)."""
    out: dict[int, tuple[bool, str]] = {}
    prefix = marker + " "
    for line in stdout.splitlines():
        if not line.startswith(prefix):
            continue
        try:
            index, ok, detail = json.loads(line[len(prefix) :])
        except (ValueError, TypeError):
            return None
        if index in out:
            return None
        out[int(index)] = (ok is True, str(detail))
    return out


def make_code(
    *,
    fraction: bool = False,
    timeout_s: float = 10.0,
    memory_mb: int | None = None,
    backend: str | None = None,
) -> Callable[..., RewardResult]:
    """The code reward (module docstring). ``fraction``: score the fraction of tests passed
    instead of all-or-nothing; ``timeout_s``: wall time of one sample's runs in all (the runner
    gives it half its ``reward.timeout_s`` unless set); ``memory_mb``: each run's memory over
    its process tree (None: ``sandbox.memory_mb``); ``backend``: the sandbox (None: the run's ``sandbox.backend``). Refuses
    to build (SandboxUnavailable) where no sandbox works."""
    if not timeout_s > 0:
        raise ValueError(f"code reward: timeout_s must be positive, got {timeout_s}")
    if memory_mb is not None and memory_mb < 16:
        raise ValueError(f"code reward: memory_mb={memory_mb} is too small to start Python")
    sandbox = require_sandbox("the code reward", backend)

    def code_reward(
        prompt: str,
        response: str,
        reference: str,
        *,
        truncated: bool = False,
        tests: Any = None,
        code_prefix: str | None = None,
        **row: Any,
    ) -> RewardResult:
        if tests is None:
            raise ValueError(
                "code reward: the row has no field 'tests' (docs/data.md: the code reward's "
                f"rows); its fields: {sorted(row)}"
            )
        parsed = parse_tests(tests, f"row {row.get('_source') or ''}".strip())
        if code_prefix is not None and not isinstance(code_prefix, str):
            raise ValueError(
                f"code reward: row field 'code_prefix' must be a string, got "
                f"{type(code_prefix).__name__}"
            )
        program = program_of(response, code_prefix)
        if program is None:
            info = dict.fromkeys(_INFO_KEYS, 0.0)
            return RewardResult(0.0, {**info, "code_no_program": 1.0})
        rep = run_tests(
            program,
            parsed,
            sandbox,
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            stop_at_failure=not fraction,
        )
        frac = sum(rep.passed) / len(parsed)
        info = {
            "correct": float(all(rep.passed)),
            "code_pass_frac": frac,
            "code_no_program": 0.0,
            "code_timeout": float(rep.timeout),
            "code_limit": float(bool(rep.limits)),
            "code_error": float(rep.error),
        }
        return RewardResult(frac if fraction else float(all(rep.passed)), info)

    return code_reward
