"""Hostile model output: every response of a generated corpus (``hostile_corpus.py``) is scored by
the RewardRunner within the per-answer time limit, gets the score a correct grader must give where
that is certain, is never executed, and costs memory at most linear in its length; a training
step's batch and its sample log survive the corpus."""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from reliability.figures import record
from reliability.hostile_corpus import (
    CATEGORIES,
    MB,
    HostileCase,
    build_corpus,
    build_giant_cases,
    spelled,
)
from reliability.rss import PeakRSS
from rlvr.rewards import symbolic
from rlvr.rewards.runner import RewardRunner
from rlvr.telemetry.samples import read_samples, write_samples

# The per-answer limit a run gets by default (reward.timeout_s); the maths grader's own symbolic
# stage gets half of it.
TIMEOUT_S = 5.0
# "Bounded" memory: at most linear in the response, 32 bytes per character (what one Python list
# entry plus a small int object per character costs) plus 64 MiB of allocator slack.
BYTES_PER_CHAR = 32
SLACK_BYTES = 64 * 2**20
SPECS = [
    {"name": "math"},
    {"name": "countdown"},
    {"name": "toy_rewards:count_sevens"},  # a user function: the response crosses the sandbox pipe
]
MATH_SCORES = {0.0, 1.0}
COUNTDOWN_SCORES = {0.0, 0.1, 1.0}


@dataclass
class Graded:
    case: HostileCase
    valid: bool
    failures: list[str]
    scores: dict[str, float]  # reward/<name> of each spec
    seconds: float
    rss_growth: int


def grade_one(runner: RewardRunner, case: HostileCase) -> Graded:
    """Score one response as a batch of one, timing it and watching this process's memory."""
    with PeakRSS() as peak:
        start = time.monotonic()
        batch = runner.score_batch(["q"], [case.response], [case.reference], [case.row], [False])
        seconds = time.monotonic() - start
    scores = {k: v for k, v in batch.infos[0].items() if k.startswith("reward/")}
    return Graded(case, batch.valid[0], batch.failures, scores, seconds, peak.growth)


def memory_bound(case: HostileCase) -> int:
    return BYTES_PER_CHAR * len(case.response) + SLACK_BYTES


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """Grade the whole corpus once, from a scratch working directory holding the canary path.

    Yields (canary, runner, results); the runner stays open for the batch test.
    """
    workdir = tmp_path_factory.mktemp("hostile")
    canary = workdir / "CANARY"
    previous = os.getcwd()
    os.chdir(workdir)
    symbolic.shutdown()  # the maths checker's next child starts in workdir too
    runner = RewardRunner(SPECS, timeout_s=TIMEOUT_S, max_failure_fraction=1.0)
    try:
        results = [grade_one(runner, case) for case in build_corpus(canary)]
        yield canary, runner, results
    finally:
        runner.close()
        os.chdir(previous)


def test_the_corpus_covers_every_category(hostile) -> None:
    _, _, results = hostile
    per_category = Counter(r.case.category for r in results)
    assert len(results) >= 300
    assert set(per_category) == set(CATEGORIES)
    assert min(per_category.values()) >= 20, per_category
    assert max(len(r.case.response) for r in results) >= MB
    record("hostile_outputs", inputs=len(results), inputs_per_category=dict(per_category))


def test_every_response_is_scored_within_the_time_limit(hostile) -> None:
    _, _, results = hostile
    failed = [(r.case.name, r.failures[:1]) for r in results if not r.valid]
    assert not failed, failed
    slow = [(r.case.name, round(r.seconds, 2)) for r in results if r.seconds > TIMEOUT_S]
    assert not slow, slow
    seconds = sorted(r.seconds for r in results)
    record(
        "hostile_outputs",
        scored_without_failure=sum(r.valid for r in results),
        max_seconds_per_answer=round(seconds[-1], 3),
        p99_seconds_per_answer=round(seconds[int(0.99 * (len(seconds) - 1))], 3),
        time_limit_s=TIMEOUT_S,
    )


def test_scores_are_in_range_and_right_where_certain(hostile) -> None:
    _, _, results = hostile
    for r in results:
        assert r.scores["reward/math"] in MATH_SCORES, r.case.name
        assert r.scores["reward/countdown"] in COUNTDOWN_SCORES, r.case.name
        assert 0.0 <= r.scores["reward/toy_rewards:count_sevens"] <= 1.0, r.case.name
    checked = 0
    for r in results:
        if r.case.expect_math is not None:
            assert r.scores["reward/math"] == r.case.expect_math, r.case.name
            checked += 1
        if r.case.expect_countdown is not None:
            assert r.scores["reward/countdown"] == r.case.expect_countdown, r.case.name
            checked += 1
    assert checked >= 150  # every code payload (Countdown 0.0) and the hand-checked right answers
    record("hostile_outputs", scores_checked_against_hand_values=checked)


def test_no_response_was_executed(hostile) -> None:
    canary, _, results = hostile
    payloads = [r for r in results if r.case.category == "code"]
    # every payload aims at the canary, by name or spelled with chr()
    targets = (str(canary), spelled(canary))
    aimed = [r for r in payloads if any(t in r.case.response for t in targets)]
    assert len(aimed) >= 150
    assert not canary.exists()
    assert not Path("CANARY").exists()  # relative to the scratch working directory
    record("hostile_outputs", code_payloads=len(aimed), payloads_executed=0)


def test_memory_grows_at_most_linearly(hostile) -> None:
    _, _, results = hostile
    over = [
        (r.case.name, r.rss_growth // 2**20, memory_bound(r.case) // 2**20)
        for r in results
        if r.rss_growth > memory_bound(r.case)
    ]
    assert not over, over
    # The sandbox children (user-reward workers, maths checker) stay small too.
    children = psutil.Process().children(recursive=True)
    child_rss = max((p.memory_info().rss for p in children), default=0)
    assert child_rss < 1024 * 2**20
    worst = max(results, key=lambda r: r.rss_growth)
    record(
        "hostile_outputs",
        max_rss_growth_mib=round(worst.rss_growth / 2**20, 1),
        max_rss_growth_case=f"{worst.case.name} ({len(worst.case.response) / MB:.1f} MB)",
        max_child_rss_mib=round(child_rss / 2**20, 1),
    )


def test_a_batch_of_hostile_responses_completes_with_the_same_scores(hostile) -> None:
    """A step scores its completions together; mixing hostile ones changes no sample's score."""
    _, runner, results = hostile
    picked = random.Random(1).sample(results, 64)
    runner.max_failure_fraction = 0.5  # the default a run uses
    batch = runner.score_batch(
        ["q"] * len(picked),
        [r.case.response for r in picked],
        [r.case.reference for r in picked],
        [r.case.row for r in picked],
        [False] * len(picked),
    )
    assert batch.valid == [True] * len(picked)
    for r, info in zip(picked, batch.infos, strict=True):
        assert {k: info[k] for k in r.scores} == r.scores, r.case.name
    record("hostile_outputs", batch_of_64_completed=True)


def test_the_sample_log_of_a_hostile_batch_reads_back(hostile, tmp_path) -> None:
    """A step writes its completions to samples/ as the engine returned them; the rollout engine
    is a public protocol, so the log must take any Python str. Text UTF-8 can hold reads back
    exactly; a lone surrogate (which no UTF-8 file can hold) reads back as its visible escape."""
    _, _, results = hostile
    records = [{"response": r.case.response, "reward": r.scores["reward/math"]} for r in results]
    write_samples(tmp_path, 1, records)
    back = read_samples(tmp_path, 1)
    expected = [r["response"].encode("utf-8", "backslashreplace").decode("utf-8") for r in records]
    assert [b["response"] for b in back] == expected
    assert (
        sum(e != r["response"] for e, r in zip(expected, records, strict=True)) > 0
    )  # some had surrogates


@pytest.mark.slow
def test_ten_megabyte_responses(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    symbolic.shutdown()
    canary = tmp_path / "CANARY"
    cases = build_giant_cases(canary)
    with RewardRunner(SPECS, timeout_s=TIMEOUT_S, max_failure_fraction=1.0) as runner:
        results = [grade_one(runner, case) for case in cases]
    symbolic.shutdown()
    for r in results:
        assert r.valid, (r.case.name, r.failures[:1])
        assert r.seconds <= TIMEOUT_S, (r.case.name, r.seconds)
        assert r.rss_growth <= memory_bound(r.case), (r.case.name, r.rss_growth // 2**20)
        if r.case.expect_math is not None:
            assert r.scores["reward/math"] == r.case.expect_math, r.case.name
    assert not canary.exists()
    record(
        "hostile_outputs_10mb",
        inputs=len(results),
        max_seconds_per_answer=round(max(r.seconds for r in results), 3),
        max_rss_growth_mib=round(max(r.rss_growth for r in results) / 2**20, 1),
    )
