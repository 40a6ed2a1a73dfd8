"""Prompt templates: how a dataset row becomes the text the model sees.

Training, in-training evaluation and `rlvr eval` all call `render_prompt`, so the three can
never drift apart (an eval path with another template can under-report accuracy by 10+ points).
"""

from __future__ import annotations

from rlvr.config.sections import TEMPLATES

# understand-r1-zero's "r1" template (the Dr.GRPO baseline of arXiv 2503.20783).
R1_TEMPLATE = (
    "A conversation between User and Assistant. The User asks a question, and the Assistant solves it. "
    "The Assistant first thinks about the reasoning process in the mind and then provides the User with "
    "the answer. The reasoning process is enclosed within <think> </think> and answer is enclosed within "
    "<answer> </answer> tags, respectively, i.e., <think> reasoning process here </think> "
    "<answer> answer here </answer>.\nUser: {question}\nAssistant: <think>"
)

# Qwen2.5-Math's system prompt with its chat markup written out (works with any tokenizer).
QWEN_MATH_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
QWEN_MATH_TEMPLATE = (
    "<|im_start|>system\n"
    + QWEN_MATH_SYSTEM.replace("{}", "{{}}")
    + "<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
)


# data.template=none has no chat markup; a conversation (an episode's, rlvr.envs.turns) is written
# as a plain dialogue: each user turn (any role but the assistant's and the system's) after
# PLAIN_USER, each assistant turn after PLAIN_CUE + " ", turns joined by a blank line, the text
# ending with PLAIN_CUE where the model's turn begins. An environment turn after a model turn is
# PLAIN_TURN: the same dialogue's next two lines.
PLAIN_USER, PLAIN_CUE = "User: ", "Assistant:"
PLAIN_TURN = "\n\n" + PLAIN_USER + "{observation}\n\n" + PLAIN_CUE


def _chat_template(tokenizer) -> None:
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "data.template=chat needs a tokenizer with a chat template; "
            "use data.template=none, r1 or qwen_math for this model"
        )


def chatml(messages: list[dict]) -> str:
    """ChatML written out (qwen_math's markup), for any tokenizer."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def render_messages(
    template: str, messages: list[dict], tokenizer=None, system_prompt: str | None = None
) -> str:
    """The text of a conversation (``[{"role", "content"}, ...]``, an episode's prompt) under
    ``template``, ending where the model's turn begins; ``system_prompt`` opens it unless the
    messages have a system message (qwen_math: its own, as its questions). The same rendering as a
    question's (`render_prompt`) and as an environment's turns (rlvr.envs.turns): under chat and
    qwen_math a single user message renders as that question does; under none a question is the
    text as is, a conversation the plain dialogue of ``PLAIN_TURN``."""
    messages = list(messages)
    if template == "qwen_math":  # its own system prompt, as its questions have (render_prompt)
        system_prompt = system_prompt if messages[0]["role"] == "system" else QWEN_MATH_SYSTEM
    if system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    if template == "chat":
        _chat_template(tokenizer)
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if template == "qwen_math":
        return chatml(messages) + "<|im_start|>assistant\n"
    if template == "none":
        parts = [
            m["content"]
            if m["role"] == "system"
            else (f"{PLAIN_CUE} " if m["role"] == "assistant" else PLAIN_USER) + m["content"]
            for m in messages
        ]
        return "\n\n".join(parts) + "\n\n" + PLAIN_CUE
    raise ValueError(f"data.template={template!r}: no conversation format (chat, qwen_math, none)")


def render_prompt(
    template: str, question: str, tokenizer=None, system_prompt: str | None = None
) -> str:
    """The exact text given to the model for ``question`` under ``template``."""
    if template == "chat":
        return render_messages(
            "chat", [{"role": "user", "content": question}], tokenizer, system_prompt
        )
    if template == "r1":
        return R1_TEMPLATE.format(question=question)
    if template == "qwen_math":
        return QWEN_MATH_TEMPLATE.format(question=question)
    if template == "none":
        return f"{system_prompt}\n\n{question}" if system_prompt else question
    raise ValueError(f"unknown template {template!r}; known: {', '.join(TEMPLATES)}")


def render_rows(
    rows: list[dict], template: str, tokenizer, system_prompt: str | None = None
) -> tuple[list[str], list[list[int]]]:
    """Prompt texts and token ids of dataset rows (a row's own ``system_prompt`` wins).

    The one place rows become model input: the trainer, every evaluation and the pre-run
    prompt-length check all call it.
    """
    texts = [
        render_prompt(template, r["prompt"], tokenizer, r.get("system_prompt") or system_prompt)
        for r in rows
    ]
    return texts, [tokenizer(t, add_special_tokens=False).input_ids for t in texts]


def asks_for_boxed(
    rows: list[dict], template: str, tokenizer=None, system_prompt: str | None = None
) -> bool:
    """Whether the prompts ask for a boxed answer (``\\boxed{}``): the template (qwen_math, or a
    chat template's default system prompt), the configured system prompt, or any row's own
    prompt or system prompt. A task that never asks for a box (the built-in arithmetic) cannot
    lose the box format, so the health gate's ``has_boxed`` rule does not apply to it."""
    texts = [system_prompt or ""]
    texts += [f"{r.get('prompt', '')} {r.get('system_prompt') or ''}" for r in rows]
    if rows:  # the template's own words, for a question with none of its own
        texts.append(render_prompt(template, "", tokenizer, system_prompt))
    return any("boxed" in str(t) for t in texts)
