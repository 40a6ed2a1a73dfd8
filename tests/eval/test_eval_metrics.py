"""rlvr.eval.metrics against hand-worked records."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlvr.eval.metrics import (
    format_table,
    greedy_pass_at_1,
    maj_at_k,
    mean_accuracy,
    pass_at_k,
    sampling_pass_at_k,
    summarize,
    vote_key,
)


def record(answers: list[str | None], correct: list[bool], reference: str = "3") -> dict:
    return {
        "prompt": "p",
        "reference": reference,
        "responses": [f"... {a}" for a in answers],
        "answers": answers,
        "correct": correct,
    }


# --------------------------------------------------------------------------- pass@k


def test_pass_at_k_by_hand() -> None:
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    # n=5, c=2, k=3: 1 - C(3,3)/C(5,3) = 1 - 1/10 = 0.9
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)
    # n=8, c=2, k=1: 1 - C(6,1)/C(8,1) = 1 - 6/8 = 0.25 (= c/n)
    assert pass_at_k(8, 2, 1) == pytest.approx(0.25)
    # n=10, c=0: no correct sample, 0 for any k
    assert pass_at_k(10, 0, 5) == 0.0
    # n=3, c=2, k=2: n-c = 1 < k, every pair holds a correct sample
    assert pass_at_k(3, 2, 2) == 1.0


def test_pass_at_k_is_stable_for_huge_binomials() -> None:
    # C(2000, 1000) ~ 2e600 overflows a float. With c = 1:
    # C(n-1, k)/C(n, k) = (n-k)/n, so pass@k = k/n = 1000/2000 = 0.5
    assert pass_at_k(2000, 1, 1000) == pytest.approx(0.5, abs=1e-15)


@given(
    st.integers(1, 9).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n)))
)
def test_pass_at_k_equals_enumeration_of_k_subsets(nck: tuple[int, int, int]) -> None:
    n, c, k = nck
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    hit = sum(any(samples[i] for i in subset) for subset in subsets)
    assert pass_at_k(n, c, k) == pytest.approx(hit / len(subsets))


@given(st.integers(2, 30).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))))
def test_pass_at_k_grows_with_k(nc: tuple[int, int]) -> None:
    n, c = nc
    values = [pass_at_k(n, c, k) for k in range(1, n + 1)]
    assert all(a <= b + 1e-12 for a, b in itertools.pairwise(values))
    assert values[0] == pytest.approx(c / n)


@pytest.mark.parametrize(
    ("n", "c", "k", "message"),
    [
        (4, 5, 1, "c must be in"),
        (4, 1, 5, "k must be in"),
        (4, 1, 0, "k must be in"),
        (0, 0, 1, "n must be"),
    ],
)
def test_pass_at_k_rejects_bad_counts(n: int, c: int, k: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pass_at_k(n, c, k)


# --------------------------------------------------------------------------- record metrics


def test_greedy_pass_at_1() -> None:
    records = [record(["3"], [True]), record(["4"], [False]), record([None], [False])]
    assert greedy_pass_at_1(records) == pytest.approx(1 / 3)  # one correct of three
    with pytest.raises(ValueError, match="record 1 has 2: use mode 'sampling'"):
        greedy_pass_at_1([record(["3"], [True]), record(["3", "3"], [True, True])])


def test_sampling_pass_at_k() -> None:
    records = [
        record(["3", "1", "2", "4"], [True, False, False, False]),  # n=4, c=1
        record(["3", "3", "3", "3"], [True, True, True, True]),  # n=4, c=4
        record(["0", "1", "2", "4"], [False, False, False, False]),  # n=4, c=0
    ]
    # k=2: (1 - C(3,2)/C(4,2)) = 0.5, then 1, then 0 -> mean 1.5 / 3 = 0.5
    assert sampling_pass_at_k(records, 2) == pytest.approx(0.5)
    # k=1: c/n -> (0.25 + 1 + 0) / 3 = 1.25 / 3
    assert sampling_pass_at_k(records, 1) == pytest.approx(1.25 / 3)
    with pytest.raises(ValueError, match="record 0 has 4 samples, fewer than k=5"):
        sampling_pass_at_k(records, 5)


# Three prompts, four samples each, worked by hand below.
MAJ_RECORDS = [
    record(["3", "5", "5", "3"], [True, False, False, True]),
    record([None, None, "7", "8"], [False, False, True, False], reference="7"),
    record([None, None, None, "1"], [False, False, False, True], reference="1"),
]


def test_maj_at_k_by_hand() -> None:
    # k=4: r0 votes 3:2, 5:2 -> tie, "3" came first -> correct
    #      r1 votes 7:1, 8:1 (None never counts) -> "7" came first -> correct
    #      r2 votes 1:1 against three None -> "1" -> correct          => 3/3
    assert maj_at_k(MAJ_RECORDS, 4) == pytest.approx(1.0)
    # k=3: r0 votes 3:1, 5:2 -> "5" -> wrong
    #      r1 votes 7:1 -> correct
    #      r2 all None -> wrong                                       => 1/3
    assert maj_at_k(MAJ_RECORDS, 3) == pytest.approx(1 / 3)
    # k=1: r0 "3" correct; r1 None -> wrong; r2 None -> wrong        => 1/3
    assert maj_at_k(MAJ_RECORDS, 1) == pytest.approx(1 / 3)


def test_maj_at_k_uses_the_first_sample_with_the_winning_answer() -> None:
    # "9" wins 2:1; the first "9" (index 1) is graded correct, the second not
    rec = record(["4", "9", "9"], [False, True, False], reference="9")
    assert maj_at_k([rec], 3) == 1.0
    with pytest.raises(ValueError, match="record 0 has no 'answers' list"):
        maj_at_k([{"correct": [True]}], 1)


def test_mean_accuracy() -> None:
    # all 4 samples: r0 2/4, r1 1/4, r2 1/4 -> (0.5 + 0.25 + 0.25) / 3 = 1/3
    assert mean_accuracy(MAJ_RECORDS) == pytest.approx(1 / 3)
    # first 2: r0 1/2, r1 0/2, r2 0/2 -> 0.5 / 3
    assert mean_accuracy(MAJ_RECORDS, 2) == pytest.approx(0.5 / 3)
    # each prompt counts once: n=1 correct and n=3 with 0 correct -> (1 + 0) / 2
    uneven = [record(["3"], [True]), record(["1", "2", "4"], [False, False, False])]
    assert mean_accuracy(uneven) == pytest.approx(0.5)


def test_records_are_checked() -> None:
    with pytest.raises(ValueError, match="records is empty"):
        mean_accuracy([])
    with pytest.raises(ValueError, match=r"record 0: 2 answers but 3 'correct' values"):
        mean_accuracy([{"answers": ["1", "2"], "correct": [True, False, True]}])
    with pytest.raises(ValueError, match="'correct' must hold booleans"):
        mean_accuracy([{"correct": [1, 0]}])
    with pytest.raises(ValueError, match="k must be a positive integer"):
        maj_at_k(MAJ_RECORDS, 0)


# --------------------------------------------------------------------------- summaries


def test_summarize_names_carry_the_mode() -> None:
    greedy = summarize([record(["3"], [True]), record(["4"], [False])], "greedy")
    assert greedy == {"greedy_pass@1": 0.5, "greedy/num_prompts": 2}

    sampled = summarize(MAJ_RECORDS, "sampling")  # k defaults to n = 4
    assert set(sampled) == {"sampling_pass@4", "maj@4", "mean_acc@4", "sampling/num_prompts"}
    # pass@4 with n=4 is 1 when c >= 1: all three prompts have a correct sample
    assert sampled["sampling_pass@4"] == 1.0
    assert sampled["maj@4"] == pytest.approx(1.0)
    assert sampled["mean_acc@4"] == pytest.approx(1 / 3)

    # k=2: r0 n=4,c=2: 1 - C(2,2)/C(4,2) = 5/6; r1, r2 c=1: 1 - C(3,2)/C(4,2) = 1/2
    # -> (5/6 + 1/2 + 1/2) / 3 = 11/18
    assert summarize(MAJ_RECORDS, "sampling", k=2)["sampling_pass@2"] == pytest.approx(11 / 18)
    proxy = summarize(MAJ_RECORDS, "nondet_proxy", k=2)
    assert set(proxy) == {"nondet_proxy_pass@2", "nondet_proxy/num_prompts"}


def test_summarize_rejects_mixups() -> None:
    with pytest.raises(ValueError, match="unknown eval mode 'best'; known: greedy, sampling"):
        summarize(MAJ_RECORDS, "best")
    with pytest.raises(ValueError, match="mode 'greedy' measures pass@1; got k=8"):
        summarize([record(["3"], [True])], "greedy", k=8)
    mixed = [record(["3"], [True]), record(["3", "4"], [True, False])]
    with pytest.raises(ValueError, match=r"different sample counts \[1, 2\]; pass k"):
        summarize(mixed, "sampling")


def test_format_table_rows_and_columns() -> None:
    table = format_table(
        {
            "step 10": {"greedy_pass@1": 0.25, "greedy/num_prompts": 4},
            "step 20": {"greedy_pass@1": 2 / 3, "maj@8": 0.5},
        }
    )
    lines = table.splitlines()
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in lines]
    # columns in first-seen order; "-" where a row lacks a metric; floats to 4 decimals
    assert cells[0] == ["", "greedy_pass@1", "greedy/num_prompts", "maj@8"]
    assert set(lines[1]) == {"|", "-"}
    assert cells[2:] == [["step 10", "0.2500", "4", "-"], ["step 20", "0.6667", "-", "0.5000"]]
    assert all(len(line) == len(lines[0]) for line in lines)  # columns line up


def test_format_table_of_one_summary() -> None:
    lines = format_table({"greedy_pass@1": 0.125, "greedy/num_prompts": 8}).splitlines()
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in lines]
    assert cells[0] == ["metric", "value"]
    assert cells[2:] == [["greedy_pass@1", "0.1250"], ["greedy/num_prompts", "8"]]
    assert all(len(line) == len(lines[0]) for line in lines)  # columns line up


def test_maj_at_k_votes_on_normalised_answers() -> None:
    # "1,000", "1000" and "1000.0" are one answer (3 votes) against "7" (2 votes). Voting on the
    # raw strings split them 1/1/1 and the first "7" won the tie-break... with 2 votes, wrongly.
    rec = {
        "answers": ["7", "1,000", "7", "1000", "1000.0"],
        "correct": [False, True, False, True, True],
    }
    assert maj_at_k([rec], 5) == 1.0
    # fractions in three spellings against two equal integers
    rec = {
        "answers": ["2", "1/2", "2", "0.5", "\\frac{1}{2}"],
        "correct": [False, True, False, True, True],
    }
    assert maj_at_k([rec], 5) == 1.0
    assert vote_key("1,000") == vote_key("1000") == vote_key("1000.0") != vote_key("100")
