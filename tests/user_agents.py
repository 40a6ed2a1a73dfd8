"""Agents for the endpoint's tests: programs that know nothing of rlvr beyond a base URL, written
against the real `openai` client (rlvr.rollout.agents calls them as ``fn(base_url, row)``)."""

from __future__ import annotations

import json
import threading

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


def _client(base_url: str) -> OpenAI:
    return OpenAI(base_url=base_url, api_key="rlvr", max_retries=0)


def _follow_up(reply, turn: int) -> list[dict]:
    """The agent's side after a reply: each tool call's result, or a user nudge."""
    if reply.tool_calls:
        out = []
        for call in reply.tool_calls:
            args = json.loads(call.function.arguments)
            result = str(int(args.get("a", 0)) + int(args.get("b", 0)))
            out.append({"role": "tool", "tool_call_id": call.id, "content": result})
        return out
    return [{"role": "user", "content": f"Turn {turn}: use the tool."}]


def three_turn_agent(base_url: str, row: dict, turns: int = 3) -> dict:
    """Three model turns with tools, history kept as the endpoint returned it; the reward is
    whether the last reply holds the row's answer, plus a length-dependent part so that a
    random model's group has different rewards."""
    client = _client(base_url)
    messages = [{"role": "user", "content": row["prompt"]}]
    reply = None
    for turn in range(turns):
        out = client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS, max_tokens=12, stop=["</tool_call>"]
        )
        reply = out.choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if turn < turns - 1:
            messages += _follow_up(reply, turn)
    text = reply.content or ""
    return {"reward": float(row["answer"] in text) + (len(text) % 3) / 3, "info": {"turns": turns}}


def rewriting_agent(base_url: str, row: dict) -> float:
    """Three turns, but before the third it drops the first exchange (its history rewritten):
    the endpoint must start a new sequence there."""
    client = _client(base_url)
    first = {"role": "user", "content": row["prompt"]}
    messages = [first]
    for turn in range(3):
        if turn == 2:
            messages = [first, *messages[3:]]  # drop the first reply and its follow-up
        out = client.chat.completions.create(model="policy", messages=messages, max_tokens=8)
        reply = out.choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": f"again {turn}"})
    return float(len(reply.content or "") % 2)


_HANG = threading.Event()  # never set: a hanging agent waits on it


def sometimes_hangs(base_url: str, row: dict) -> float:
    """One reply, then a hang on every row whose answer is even (until the test process ends)."""
    out = _client(base_url).chat.completions.create(
        model="policy", messages=[{"role": "user", "content": row["prompt"]}], max_tokens=6
    )
    if int(row["answer"]) % 2 == 0:
        _HANG.wait(3600)
    return float(len(out.choices[0].message.content or "") % 2)


def delayed_call(base_url: str, row: dict) -> float:
    """One request, sent ``row["delay"]`` seconds after the episode starts."""
    import time

    time.sleep(float(row.get("delay", 0)))
    out = _client(base_url).chat.completions.create(
        model="policy", messages=[{"role": "user", "content": row["prompt"]}], max_tokens=6
    )
    return float(len(out.choices[0].message.content or "") % 2)


_ROLES: dict[str, int] = {}  # episodes started per prompt
_FIRST: list[str] = []  # prompts in the order their first episode started
_ROLES_LOCK = threading.Lock()


def reset_roles() -> None:
    with _ROLES_LOCK:
        _ROLES.clear()
        _FIRST.clear()


def roles_agent(base_url: str, row: dict) -> float:
    """Episodes of known shapes for a worked example (groups of 3). The first prompt to start:
    its first episode makes a second request with a new history (split: two sequences) and
    earns 1, its second plays once and earns 0, its third raises after one request (failed).
    Every other prompt: three one-call episodes earning 0, 0.5, 1."""
    with _ROLES_LOCK:
        if row["prompt"] not in _ROLES:
            _ROLES[row["prompt"]] = 0
            _FIRST.append(row["prompt"])
        k = _ROLES[row["prompt"]] % 3
        _ROLES[row["prompt"]] += 1
        first = _FIRST[0] == row["prompt"]
    client = _client(base_url)
    msgs = [{"role": "user", "content": row["prompt"]}]
    client.chat.completions.create(model="policy", messages=msgs, max_tokens=4)
    if not first:
        return [0.0, 0.5, 1.0][k]
    if k == 0:
        again = [{"role": "user", "content": "Once more."}]
        client.chat.completions.create(model="policy", messages=again, max_tokens=4)
        return 1.0
    if k == 2:
        raise RuntimeError("the agent broke")
    return 0.0
