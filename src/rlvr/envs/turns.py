"""Token ids of an episode's turns, rendered once with the model's chat template.

Token in, token out: the episode is the prompt's ids, then each model turn's ids exactly as the
engine sampled them, then each environment turn's ids rendered here, and so on. Nothing is
decoded and encoded again, so the trainer scores exactly the tokens the model produced.

An environment turn is the text the chat template puts between the end of an assistant
message's content and the start of the next one's (closing the assistant turn, the observation
as a message of ``role``, opening the next assistant turn). It is found once per role by
rendering a conversation with sentinel contents and cutting the text around them, so it holds
whatever that template writes there. When the model ended its turn with the EOS token and the
template's separator begins with that token's text, the separator starts after it (the model's
EOS already closed the turn). Templates (``data.template``):

- ``chat``: the tokenizer's own chat template;
- ``qwen_math``: ChatML written out, as its prompt is (``data/templates.py``);
- ``none``: plain text, ``"\\n\\nUser: {observation}\\n\\nAssistant:"`` (no template to follow;
  a prompt of messages is the same dialogue: ``data.templates.render_messages``).

Known differences from ``apply_chat_template`` of the same messages (tested in
tests/envs/test_turns.py): the template's text after the last assistant turn's EOS (ChatML's
final newline) is not part of the episode; a template that rewrites earlier turns when later ones
are added (one that strips reasoning from past assistant messages) renders those turns otherwise
than the model produced them: the episode keeps the model's tokens (``prefix_stable`` tells; `rlvr.rollout.episodes` asks once
per run and warns).
"""

from __future__ import annotations

from rlvr.data.templates import PLAIN_TURN, render_messages, render_prompt

_S1, _S2, _U = "\x00RLVR_MODEL\x00", "\x00RLVR_OBS\x00", "\x00RLVR_USER\x00"
CHATML_TURN = "<|im_end|>\n<|im_start|>{role}\n{observation}<|im_end|>\n<|im_start|>assistant\n"
TEMPLATES = ("chat", "qwen_math", "none")


class TurnRenderer:
    """The episode's prompt and environment turns for ``template`` and ``tokenizer``."""

    def __init__(self, template: str, tokenizer, system_prompt: str | None = None) -> None:
        if template not in TEMPLATES:
            raise ValueError(
                f"data.template={template!r}: episodes need one of {', '.join(TEMPLATES)}"
            )
        self.template, self.tokenizer, self.system_prompt = template, tokenizer, system_prompt
        eos = tokenizer.eos_token_id
        self.eos_id = eos
        self.eos_text = tokenizer.convert_ids_to_tokens(eos) if eos is not None else None
        self._separators: dict[str, tuple[str, str]] = {}

    # ------------------------------------------------------------------ prompts
    def prompt_text(self, prompt: str | list[dict], system_prompt: str | None = None) -> str:
        """The text of the episode's first prompt: a question rendered as single-turn prompts
        are (``render_prompt``), or messages (``[{"role", "content"}, ...]``) with the template,
        ending where the model's first turn begins."""
        system = system_prompt or self.system_prompt
        if isinstance(prompt, str):
            return render_prompt(self.template, prompt, self.tokenizer, system)
        return render_messages(self.template, _check_messages(prompt), self.tokenizer, system)

    def prompt_ids(self, prompt: str | list[dict], system_prompt: str | None = None) -> list[int]:
        return self.encode(self.prompt_text(prompt, system_prompt))

    # ------------------------------------------------------------------ environment turns
    def separator(self, role: str) -> tuple[str, str]:
        """(text before, text after) the observation in an environment turn of ``role``."""
        if role not in self._separators:
            self._separators[role] = self._find_separator(role)
        return self._separators[role]

    def _find_separator(self, role: str) -> tuple[str, str]:
        if self.template == "qwen_math":
            before, _, after = CHATML_TURN.format(role=role, observation=_S2).partition(_S2)
            return before, after
        if self.template == "none":
            before, _, after = PLAIN_TURN.format(observation=_S2).partition(_S2)
            return before, after
        messages = [
            {"role": "user", "content": _U},
            {"role": "assistant", "content": _S1},
            {"role": role, "content": _S2},
        ]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        if _S1 not in text or _S2 not in text:
            raise ValueError(
                f"the chat template drops a message of role {role!r} or of the assistant; "
                "episodes need a template that renders every message (docs/environments.md)"
            )
        between = text.split(_S1, 1)[1]
        before, _, after = between.partition(_S2)
        return before, after

    def env_turn_text(self, observation: str, role: str, model_ended_with_eos: bool) -> str:
        """The text of one environment turn after a model turn."""
        before, after = self.separator(role)
        if model_ended_with_eos and self.eos_text and before.startswith(self.eos_text):
            before = before[len(self.eos_text) :]
        return before + observation + after

    def env_turn_ids(self, observation: str, role: str, model_ended_with_eos: bool) -> list[int]:
        """The token ids of one environment turn (rendered and encoded once)."""
        return self.encode(self.env_turn_text(observation, role, model_ended_with_eos))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def prefix_stable(self, role: str = "user") -> bool:
        """Whether the template renders a two-turn conversation as the first turn's text
        followed by more text (False: it rewrites earlier turns when later ones are added, and
        the episode's ids differ there from ``apply_chat_template`` of the whole
        conversation)."""
        if self.template != "chat":
            return True
        one = [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "<think>a</think>b"},
        ]
        two = [*one, {"role": role, "content": "o"}, {"role": "assistant", "content": "c"}]
        t = self.tokenizer
        first = t.apply_chat_template(one, tokenize=False)
        both = t.apply_chat_template(two, tokenize=False)
        return both.startswith(first)

    def rewrite_warning(self, role: str = "user") -> str | None:
        """What to tell the user when the chat template rewrites earlier turns (``prefix_stable``
        False), else None. An episode keeps the model's tokens, so from its second turn on the
        trainer learns on contexts that inference, which renders the whole conversation with
        the template again, never shows."""
        if self.prefix_stable(role):
            return None
        name = getattr(self.tokenizer, "name_or_path", "") or "the tokenizer"
        return (
            f"data.template=chat: the chat template of {name} rewrites earlier turns when later "
            "ones are added (e.g. it drops the <think> reasoning of past assistant turns); an "
            "episode keeps the tokens the model produced, so from its second turn on training "
            "sees contexts that inference with this template never shows (docs/environments.md)"
        )


def _check_messages(prompt: list) -> list[dict]:
    if not prompt or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in prompt
    ):
        raise ValueError(
            "env.reset() must return a prompt text or a non-empty list of "
            "{'role': str, 'content': str} messages"
        )
    return [dict(m) for m in prompt]
