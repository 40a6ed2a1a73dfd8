"""Token in, token out: an episode assembled from the model's tokens and environment turns
rendered once equals the chat template's rendering of the same messages, template by template,
and the differences that remain are the named ones."""

from __future__ import annotations

import pytest

from bpe_tokenizers import CHATML, LLAMA3, STRIPS_THINKING, bpe_tokenizer
from rlvr.data.templates import QWEN_MATH_TEMPLATE
from rlvr.envs.turns import TurnRenderer

QUESTION = "What is 12 + 30?"
# model turn, observation, model turn, observation, model turn
TURNS = [
    "<calc>12+30</calc>",
    "<result>42</result>",
    "I think it is 42.",
    "Higher.",
    "The answer is 42.",
]


def assemble(renderer: TurnRenderer, stops_on_eos: bool = True) -> list[int]:
    """The episode as rlvr builds it: prompt ids, each model turn's tokens as "sampled" (its
    text encoded, then EOS when the model ends its turn itself), each observation rendered."""
    tok = renderer.tokenizer
    ids = renderer.prompt_ids(QUESTION)
    for k, text in enumerate(TURNS):
        if k % 2 == 0:
            ids += renderer.encode(text) + ([tok.eos_token_id] if stops_on_eos else [])
        else:
            ids += renderer.env_turn_ids(text, "user", model_ended_with_eos=stops_on_eos)
    return ids


def messages() -> list[dict]:
    out = [{"role": "user", "content": QUESTION}]
    for k, text in enumerate(TURNS):
        out.append({"role": "assistant" if k % 2 == 0 else "user", "content": text})
    return out


@pytest.mark.parametrize("template, eos", [(CHATML, "<|im_end|>"), (LLAMA3, "<|eot_id|>")])
def test_chat_template_episode_equals_apply_chat_template(template, eos):
    tok = bpe_tokenizer(template, eos)
    renderer = TurnRenderer("chat", tok)
    full = tok.apply_chat_template(messages(), tokenize=False)
    want = tok(full, add_special_tokens=False).input_ids
    got = assemble(renderer)
    # the named difference: the template's text after the last turn's EOS (ChatML's newline)
    last_eos = len(want) - 1 - want[::-1].index(tok.eos_token_id)
    assert got == want[: last_eos + 1]
    tail = tok.decode(want[last_eos + 1 :])
    assert tail == ("\n" if template == CHATML else "")
    assert renderer.prefix_stable()


def test_model_turn_ended_by_a_stop_string_gets_the_template_closing():
    """A tool call stopped on '</calc>' carries no EOS: the environment turn closes it."""
    tok = bpe_tokenizer(CHATML)
    renderer = TurnRenderer("chat", tok)
    ids = renderer.prompt_ids(QUESTION) + renderer.encode(TURNS[0])
    ids += renderer.env_turn_ids(TURNS[1], "user", model_ended_with_eos=False)
    ids += renderer.encode(TURNS[2]) + [tok.eos_token_id]
    msgs = messages()[:4]
    want = tok(tok.apply_chat_template(msgs, tokenize=False), add_special_tokens=False).input_ids
    assert ids == want[:-1]  # all but ChatML's final newline
    assert renderer.env_turn_text("o", "user", False).startswith("<|im_end|>\n<|im_start|>user")
    assert renderer.env_turn_text("o", "user", True).startswith("\n<|im_start|>user")


def test_qwen_math_episode_equals_chatml_with_its_system_prompt():
    tok = bpe_tokenizer(CHATML)
    renderer = TurnRenderer("qwen_math", tok)
    system = QWEN_MATH_TEMPLATE.split("<|im_start|>system\n")[1].split("<|im_end|>")[0]
    system = system.replace("{{}}", "{}")
    msgs = [{"role": "system", "content": system}, *messages()]
    full = tok.apply_chat_template(msgs, tokenize=False)
    want = tok(full, add_special_tokens=False).input_ids
    assert assemble(renderer) == want[:-1]  # ChatML's final newline


def test_plain_template_joins_turns_as_text():
    """data.template=none: no chat template; the turns are plain text. The named difference:
    byte-level BPE may merge across a turn boundary when the whole text is encoded at once; the
    episode keeps the tokens each piece had (here the boundaries happen not to merge)."""
    tok = bpe_tokenizer(CHATML)
    renderer = TurnRenderer("none", tok)
    text = QUESTION
    for k, t in enumerate(TURNS):
        text += t + ("<|im_end|>" if k % 2 == 0 else "")
        text = text if k % 2 == 0 else text.replace(t, f"\n\nUser: {t}\n\nAssistant:")
    ids = assemble(renderer)
    assert tok.decode(ids) == text
    assert renderer.env_turn_text("Higher.", "user", True) == "\n\nUser: Higher.\n\nAssistant:"


def test_template_that_rewrites_earlier_turns_is_named():
    """A template that drops earlier turns' reasoning re-renders the past: the episode keeps
    the model's own tokens there, so it differs from apply_chat_template exactly in that turn."""
    tok = bpe_tokenizer(STRIPS_THINKING)
    renderer = TurnRenderer("chat", tok)
    assert not renderer.prefix_stable()
    first = "<think>12+30</think>42"
    ids = renderer.prompt_ids(QUESTION) + renderer.encode(first) + [tok.eos_token_id]
    ids += renderer.env_turn_ids("Sure?", "user", True) + renderer.encode("42") + [tok.eos_token_id]
    msgs = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": first},
        {"role": "user", "content": "Sure?"},
        {"role": "assistant", "content": "42"},
    ]
    want = tok(tok.apply_chat_template(msgs, tokenize=False), add_special_tokens=False).input_ids
    assert tok.decode(ids) != tok.decode(want[:-1])
    past = "assistant\n42<|im_end|>"  # the template's first assistant turn, reasoning dropped
    assert tok.decode(ids) == tok.decode(want[:-1]).replace(
        past, f"assistant\n{first}<|im_end|>", 1
    )


def test_messages_prompt_and_bad_prompts():
    tok = bpe_tokenizer(CHATML)
    renderer = TurnRenderer("chat", tok)
    msgs = [{"role": "user", "content": QUESTION}]
    assert renderer.prompt_text(msgs) == renderer.prompt_text(QUESTION)
    with pytest.raises(ValueError, match="role"):
        renderer.prompt_text([{"content": "x"}])
    with pytest.raises(ValueError, match="data.template='r1'"):
        TurnRenderer("r1", tok)


def test_plain_template_writes_messages_as_its_environment_turns():
    """data.template=none: a conversation (the calculator's worked example) is written with the
    labels and the final cue the environment's turns use, so the model's first turn is prompted
    as every later one is. By hand: each user turn 'User: ...', each assistant turn
    'Assistant: ...', joined by a blank line, ending with the cue 'Assistant:'."""
    tok = bpe_tokenizer(CHATML)
    renderer = TurnRenderer("none", tok)
    msgs = [
        {"role": "user", "content": "What is 12 * 34?"},
        {"role": "assistant", "content": "<calc>12 * 34</calc>"},
        {"role": "user", "content": "<result>408</result>"},
        {"role": "assistant", "content": "The answer is 408."},
        {"role": "user", "content": QUESTION},
    ]
    assert renderer.prompt_text(msgs) == (
        "User: What is 12 * 34?\n\nAssistant: <calc>12 * 34</calc>\n\n"
        "User: <result>408</result>\n\nAssistant: The answer is 408.\n\n"
        f"User: {QUESTION}\n\nAssistant:"
    )
    # one rendering: the conversation up to an observation is the shorter one, the model's
    # reply and the environment's turn for that observation
    reply = " " + msgs[1]["content"]
    turn = renderer.env_turn_text(msgs[2]["content"], "user", model_ended_with_eos=False)
    assert renderer.prompt_text(msgs[:3]) == renderer.prompt_text(msgs[:1]) + reply + turn
    # a system prompt opens the text, as it does a single-turn prompt under none
    assert renderer.prompt_text(msgs[:1], "Be brief.") == (
        "Be brief.\n\nUser: What is 12 * 34?\n\nAssistant:"
    )


def test_calc_tool_worked_example_under_the_plain_template():
    from rlvr.envs.calculator import CalculatorEnv

    tok = bpe_tokenizer(CHATML)
    prompt = CalculatorEnv(instructions=False, few_shot=1).reset({"prompt": QUESTION})
    text = TurnRenderer("none", tok).prompt_text(prompt)
    assert text.startswith("User: What is 12 * 34?\n\nAssistant: <calc>12 * 34</calc>")
    assert text.endswith(f"\n\nUser: {QUESTION}\n\nAssistant:")


def test_a_one_message_conversation_renders_as_its_question_under_chatml_templates():
    """qwen_math's single-turn prompt carries Qwen2.5-Math's system prompt: a conversation
    without a system message gets it too (the same prompt whether reset returns the question or
    the question as a message)."""
    tok = bpe_tokenizer(CHATML)
    for template in ("chat", "qwen_math"):
        renderer = TurnRenderer(template, tok)
        msgs = [{"role": "user", "content": QUESTION}]
        assert renderer.prompt_text(msgs) == renderer.prompt_text(QUESTION), template


@pytest.mark.parametrize("template, warned", [(CHATML, False), (STRIPS_THINKING, True)])
def test_episodes_warn_once_when_the_template_rewrites_earlier_turns(
    template, warned, monkeypatch, caplog
):
    """prefix_stable() runs once when a run's episodes are set up: a chat template that drops
    past reasoning warns (training would see contexts inference never shows); one that does not
    stays quiet."""
    import logging

    import rlvr.envs.turns as turns
    from rlvr.config import load_config
    from rlvr.rollout.episodes import EpisodeRunner

    tok = bpe_tokenizer(template)
    calls = []
    real = turns.TurnRenderer.prefix_stable

    def counted(self, role="user"):
        calls.append(role)
        return real(self, role)

    monkeypatch.setattr(turns.TurnRenderer, "prefix_stable", counted)
    cfg = load_config(None, ["env.name=calculator", "data.template=chat"])
    with caplog.at_level(logging.WARNING):
        runner = EpisodeRunner.from_config(cfg, tok)
    assert runner is not None and calls == ["user"]
    said = [r.getMessage() for r in caplog.records if "earlier turns" in r.getMessage()]
    assert len(said) == (1 if warned else 0), said
    if warned:
        assert "data.template=chat" in said[0] and "<think>" in said[0]
