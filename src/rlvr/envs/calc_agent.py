"""The calculator task as an agent that knows nothing of rlvr: an OpenAI client, a calculator tool
in the OpenAI format, worked examples (env.name=agent:rlvr.envs.calc_agent:play,
recipes/calc_agent.yaml; docs/environments.md, "Agents").

The conversation shows solved problems (``few_shot``) the way the OpenAI API carries tools (an assistant
message with a ``calculator`` tool call, the tool's result, the answer), then asks the row's
question. Each tool call the model makes is answered by the calculator (the rewards' safe
arithmetic parser, rlvr.envs.calculator.calculate), until the model answers without one or
``max_calls`` replies were asked for. The reward is 1 when the last reply's last integer is the
row's answer. Only the ``openai`` package is imported for the episode; the endpoint renders the
tools and calls with the model's chat template (Hermes ``<tool_call>`` blocks where the template
has no tool support, as SmolLM2's).
"""

from __future__ import annotations

import json
import re
from typing import Any

from rlvr.envs.calculator import calculate

TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression (integers, + - * / and parentheses).",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
EXAMPLES = (("What is 12 * 34?", "12 * 34"), ("What is 507 * 86?", "507 * 86"))
CALL_TEXT = "I will use the calculator."
_INT = re.compile(r"-?\d[\d,]*")


def example_messages(few_shot: int = 2) -> list[dict]:
    """The first ``few_shot`` worked examples as OpenAI messages: question, tool call, result,
    answer."""
    out: list[dict] = []
    for k, (question, expression) in enumerate(EXAMPLES[:few_shot]):
        value = calculate(expression)
        call = {
            "id": f"call_example_{k}",
            "type": "function",
            "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})},
        }
        out += [
            {"role": "user", "content": question},
            {"role": "assistant", "content": CALL_TEXT, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": value},
            {"role": "assistant", "content": f"The answer is {value}."},
        ]
    return out


def last_integer(text: str) -> str | None:
    found = _INT.findall(text or "")
    return found[-1].replace(",", "") if found else None


def play(
    base_url: str, row: dict, max_calls: int = 3, max_tokens: int = 64, few_shot: int = 2
) -> dict[str, Any]:
    """One episode of ``row`` (``prompt``, ``answer``) against ``base_url``."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="rlvr", max_retries=0)
    messages = [*example_messages(few_shot), {"role": "user", "content": row["prompt"]}]
    calls = 0
    reply = None
    for _ in range(max_calls):
        out = client.chat.completions.create(
            model="policy",
            messages=messages,
            tools=[TOOL],
            max_tokens=max_tokens,
            stop=["</tool_call>"],
        )
        reply = out.choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            calls += 1
            try:
                expression = str(json.loads(call.function.arguments).get("expression", ""))
                result = calculate(expression)
            except (json.JSONDecodeError, AttributeError) as exc:
                result = f"error: {exc}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    answer = last_integer(reply.content if reply is not None else "")
    correct = answer is not None and answer == str(row["answer"]).strip()
    return {"reward": float(correct), "info": {"tool_calls": calls}}
