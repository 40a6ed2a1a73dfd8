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
QWEN_MATH_TEMPLATE = (
    "<|im_start|>system\nPlease reason step by step, and put your final answer within \\boxed{{}}."
    "<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
)


# data.template=none as a dialogue (the prompts and turns of episodes, rlvr.envs.turns): each
# message a paragraph labelled "User:" or "Assistant:" (a system message unlabelled, first, as
# the single-turn template writes it), ending with the cue the model answers after. An
# environment turn continues the same dialogue (PLAIN_TURN), so a prompt, the model's turn and
# the environment's read as the prompt of the longer conversation.
PLAIN_SEP = "\n\n"
PLAIN_CUE = "Assistant:"
PLAIN_TURN = PLAIN_SEP + "User: {observation}" + PLAIN_SEP + PLAIN_CUE


def render_plain_messages(messages: list[dict]) -> str:
    """``messages`` (``[{"role", "content"}, ...]``) as the plain dialogue of data.template=none,
    ending with the cue of the model's turn."""
    parts = [
        m["content"]
        if m["role"] == "system"
        else f"{'Assistant' if m['role'] == 'assistant' else 'User'}: {m['content']}"
        for m in messages
    ]
    return PLAIN_SEP.join([*parts, PLAIN_CUE])


def render_prompt(
    template: str, question: str, tokenizer=None, system_prompt: str | None = None
) -> str:
    """The exact text given to the model for ``question`` under ``template``."""
    if template == "chat":
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "data.template=chat needs a tokenizer with a chat template; "
                "use data.template=none, r1 or qwen_math for this model"
            )
        messages = [{"role": "user", "content": question}]
        if system_prompt:
            messages.insert(0, {"role": "system", "content": system_prompt})
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
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
