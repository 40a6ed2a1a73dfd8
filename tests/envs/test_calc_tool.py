"""data.task=calc_tool: the generator (rows fixed by the seed, answers right, splits disjoint),
what the task turns on (the calculator with a worked example, episode limits), and the evaluator
playing episodes with the environment: an episode that calls the calculator and copies its
result scores 1, one that answers from memory scores 0, and the tool-call rate says which."""

from __future__ import annotations

import re

import pytest

from rlvr.config import load_config, validate
from rlvr.data.rows import load_rows_for, reward_specs
from rlvr.data.tasks import calc_tool_rows, task_rows
from rlvr.envs.calculator import CalculatorEnv
from rlvr.envs.turns import TurnRenderer
from rlvr.eval.evaluator import evaluate, generate_records
from rlvr.rewards.runner import RewardRunner
from rlvr.rollout.base import Completion
from rlvr.rollout.episodes import EpisodeLimits, EpisodeRunner

QUESTION = re.compile(r"What is (\d+) \* (\d+)\?")


def test_rows_are_fixed_by_the_seed_and_their_answers_are_right():
    train, held = calc_tool_rows(num_train=50, num_eval=20, seed=3)
    assert (train, held) == calc_tool_rows(num_train=50, num_eval=20, seed=3)
    assert held != calc_tool_rows(num_train=50, num_eval=20, seed=4)[1]
    assert len(train) == 50 and len(held) == 20
    assert len({r["prompt"] for r in held}) == 20  # distinct held-out problems
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    for row in train + held:
        a, b = map(int, QUESTION.fullmatch(row["prompt"]).groups())
        assert 100 <= a <= 999 and 10 <= b <= 99
        assert row["answer"] == str(a * b)
    # by hand: 964 * 59 = 57840 - 964, 141 * 43 = 5640 + 423, 514 * 48 = 25700 - 1028;
    # 466 * 84 = 37280 + 1864
    train, held = calc_tool_rows(num_train=1, num_eval=3, seed=0)
    assert held == [
        {"prompt": "What is 964 * 59?", "answer": "56876"},
        {"prompt": "What is 141 * 43?", "answer": "6063"},
        {"prompt": "What is 514 * 48?", "answer": "24672"},
    ]
    assert train == [{"prompt": "What is 466 * 84?", "answer": "39144"}]
    two, _ = task_rows("calc_tool", num_train=5, num_eval=1, seed=0, digits=2, digits_b=1)
    for row in two:
        a, b = map(int, QUESTION.fullmatch(row["prompt"]).groups())
        assert 10 <= a <= 99 and 1 <= b <= 9 and row["answer"] == str(a * b)


@pytest.mark.parametrize(
    ("kwargs", "knob"),
    [
        ({"ops": ["^"]}, "data.task_kwargs.ops"),
        ({"digits": 0}, "data.task_kwargs.digits=0"),
        ({"digits_b": 12}, "data.task_kwargs.digits_b=12"),
    ],
)
def test_bad_task_kwargs_name_the_knob(kwargs, knob):
    with pytest.raises(ValueError, match=re.escape(knob)):
        calc_tool_rows(num_train=2, num_eval=2, **kwargs)
    with pytest.raises(ValueError, match="distinct problems"):
        calc_tool_rows(num_train=2, num_eval=40, digits=1, digits_b=1)


def test_the_task_turns_on_the_calculator_unless_env_name_is_given():
    cfg = load_config(None, ["data.task=calc_tool"])
    assert cfg.env.name == "calculator"
    assert cfg.env.kwargs == {"instructions": False, "few_shot": 1}
    r = cfg.rollout
    assert (r.max_turns, r.max_new_tokens, r.max_episode_tokens) == (3, 32, 96)
    assert [s.name for s in reward_specs(cfg)] == ["math"]
    assert validate.problems(cfg) == []
    train, held = load_rows_for(cfg)
    assert len(train) == 2000 and len(held) == 100
    # keys the config gives win; kwargs merge
    cfg = load_config(None, ["data.task=calc_tool", "rollout.max_turns=5", "env.kwargs.few_shot=2"])
    assert cfg.rollout.max_turns == 5 and cfg.rollout.max_new_tokens == 32
    assert cfg.env.kwargs == {"instructions": False, "few_shot": 2}
    # env.name given (null: the same problems single-turn): nothing filled in
    cfg = load_config(None, ["data.task=calc_tool", "env.name=null"])
    assert cfg.env.name is None and cfg.rollout.max_turns == 4 and cfg.rollout.max_new_tokens == 48
    cfg = load_config(None, ["data.task=calc_tool", "env.name=calculator"])
    assert cfg.env.kwargs == {} and cfg.rollout.max_episode_tokens == 256
    # another task gets no episode settings; a saved config reads back the same
    assert load_config(None, ["data.task=arithmetic"]).env.name is None
    full = load_config(None, ["data.task=calc_tool"])
    assert type(full).model_validate(full.model_dump()) == full


def test_few_shot_shows_worked_examples_before_the_question(tiny_tokenizer):
    env = CalculatorEnv(instructions=False, few_shot=1)
    assert env.reset({"prompt": "What is 237 * 82?"}) == [
        {"role": "user", "content": "What is 12 * 34?"},
        {"role": "assistant", "content": "<calc>12 * 34</calc>"},
        {"role": "user", "content": "<result>408</result>"},
        {"role": "assistant", "content": "The answer is 408."},
        {"role": "user", "content": "What is 237 * 82?"},
    ]
    two = CalculatorEnv(few_shot=2).reset({"prompt": "q"})
    assert len(two) == 9 and two[6] == {"role": "user", "content": "<result>43602</result>"}
    assert two[0]["content"].startswith("What is 12 * 34?\n\nYou may use a calculator")
    assert CalculatorEnv().reset({"prompt": "q"}).startswith("q\n\nYou may use a calculator")
    text = TurnRenderer("chat", tiny_tokenizer).prompt_text(env.reset({"prompt": "q"}))
    assert text.endswith("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n")
    assert "<|im_start|>assistant\n<calc>12 * 34</calc><|im_end|>" in text
    with pytest.raises(ValueError, match=r"env.kwargs.few_shot=3"):
        CalculatorEnv(few_shot=3)


class ToolUser:
    """A scripted engine: to a prompt that ends with a calculator result it answers with that
    number; otherwise it calls the calculator on the last question when ``uses_tool(a, b)``,
    else it answers ``a * b + 1`` from memory (wrong). One char token per character."""

    name = "scripted"

    def __init__(self, tokenizer, uses_tool):
        self.tok, self.uses_tool, self.calls = tokenizer, uses_tool, 0

    def generate(self, prompt_ids, params):
        self.calls += 1
        out = []
        for i, ids in enumerate(prompt_ids):
            text = self.tok.decode(ids)
            result = re.search(
                r"<result>(\d+)</result><\|im_end\|>\n<\|im_start\|>assistant\n$", text
            )
            a, b = map(int, QUESTION.findall(text)[-1])
            if result:
                reply = f"The answer is {result.group(1)}."
            elif self.uses_tool(a, b):
                reply = f"<calc>{a} * {b}</calc>"
            else:
                reply = f"The answer is {a * b + 1}."
            tokens = self.tok(reply, add_special_tokens=False).input_ids + [self.tok.eos_token_id]
            tokens = tokens[: params.max_new_tokens]
            comp = Completion(i, tokens, [-0.5] * len(tokens), reply, "stop")
            out.append([comp] * params.n)
        return out


ROWS = [
    {"prompt": "What is 237 * 82?", "answer": "19434"},
    {"prompt": "What is 967 * 18?", "answer": "17406"},
    {"prompt": "What is 505 * 10?", "answer": "5050"},
    {"prompt": "What is 412 * 25?", "answer": "10300"},
]


@pytest.fixture
def math_rewards():
    runner = RewardRunner([{"name": "math"}], timeout_s=10.0, max_failure_fraction=1.0)
    yield runner
    runner.close()


def _runner(tokenizer) -> EpisodeRunner:
    limits = EpisodeLimits(
        max_turns=3, max_episode_tokens=200, timeout_s=5.0, max_observation_chars=100
    )
    return EpisodeRunner(
        lambda: CalculatorEnv(instructions=False, few_shot=1),
        TurnRenderer("chat", tokenizer),
        limits,
    )


@pytest.mark.parametrize(
    ("uses_tool", "accuracy", "tool_rate"),
    [
        (lambda a, b: True, 1.0, 1.0),
        (lambda a, b: False, 0.0, 0.0),
        (lambda a, b: b > 20, 0.5, 0.5),  # 237 * 82 and 412 * 25 call it, the others do not
    ],
)
def test_the_evaluator_plays_episodes_with_the_tool(
    tiny_tokenizer, math_rewards, uses_tool, accuracy, tool_rate
):
    from rlvr.config.eval import EvalModeConfig

    engine = ToolUser(tiny_tokenizer, uses_tool)
    scores, records = evaluate(
        engine,
        tiny_tokenizer,
        ROWS,
        math_rewards,
        template="chat",
        system_prompt=None,
        mode=EvalModeConfig(kind="greedy"),
        max_new_tokens=40,
        batch_size=3,  # two chunks of rows
        episodes=_runner(tiny_tokenizer),
    )
    assert scores["greedy_pass@1"] == pytest.approx(accuracy)
    assert scores["greedy/tool_call_rate"] == pytest.approx(tool_rate)
    assert scores["greedy/env_failure_rate"] == 0.0
    for record, row in zip(records, ROWS, strict=True):
        a, b = map(int, QUESTION.fullmatch(row["prompt"]).groups())
        called = uses_tool(a, b)
        assert record["tool_calls"] == [int(called)]
        assert record["turns"] == [2 if called else 1]
        assert record["correct"] == [called]
        assert record["answers"] == [row["answer"] if called else str(a * b + 1)]
        if called:  # the record shows the whole episode; lengths count the model's tokens
            assert f"<calc>{a} * {b}</calc>" in record["responses"][0]
            assert f"<result>{row['answer']}</result>" in record["responses"][0]
            model = len(f"<calc>{a} * {b}</calc>") + len(f"The answer is {row['answer']}.") + 2
            assert record["lengths"] == [model]
    assert scores["greedy/turns_mean"] == pytest.approx(1.0 + tool_rate)


def test_without_episodes_the_same_engine_scores_its_first_reply(tiny_tokenizer, math_rewards):
    """The single-turn path grades the first reply, the tool call itself: 0 (what evaluation
    reported for a tool task before it played episodes)."""
    from rlvr.rollout.base import SamplingParams

    engine = ToolUser(tiny_tokenizer, lambda a, b: True)
    records = generate_records(
        engine,
        tiny_tokenizer,
        ROWS,
        math_rewards,
        template="chat",
        system_prompt=None,
        params=SamplingParams(n=1, temperature=0.0, max_new_tokens=40),
    )
    assert [r["correct"] for r in records] == [[False]] * 4
    assert "tool_calls" not in records[0]


def test_training_evaluates_the_held_out_split_with_the_calculator(tiny_model_dir, tmp_path):
    """`rlvr train data.task=calc_tool`: the before/after evaluation plays episodes (records
    with tool calls and turns, the tool-call rate beside the accuracy, provenance env)."""
    import json

    from rlvr.training.trainer import Trainer

    cfg = load_config(
        None,
        [
            "data.task=calc_tool",
            f"model.name_or_path={tiny_model_dir}",
            f"train.output_dir={tmp_path}",
            "train.run_name=calc",
            "data.template=none",  # the tiny tokenizer has no chat template
            "data.num_train=8",
            "data.num_eval=3",
            "rollout.max_new_tokens=6",
            "rollout.max_episode_tokens=40",
            "algo.prompts_per_step=2",
            "algo.group_size=2",
            "train.max_steps=1",
            "logging.progress=false",
        ],
    )
    summary = Trainer(cfg).fit()
    run = tmp_path / "calc"
    for step in (0, 1):
        payload = json.loads((run / "eval" / f"step_{step:06d}.json").read_text())
        assert payload["provenance"]["env"] == "calculator"
        records = payload["records"]["heldout"]["greedy"]
        assert len(records) == 3
        for record in records:
            assert len(record["turns"]) == len(record["tool_calls"]) == 1
            assert 1 <= record["turns"][0] <= 3
            assert record["lengths"][0] <= 3 * 6  # the model's tokens: at most 3 turns of 6
        results = payload["results"]["heldout"]
        rate = sum(r["tool_calls"][0] > 0 for r in records) / 3
        assert results["greedy/tool_call_rate"] == pytest.approx(rate)
    assert "eval/heldout/greedy/tool_call_rate" in summary["after"]
