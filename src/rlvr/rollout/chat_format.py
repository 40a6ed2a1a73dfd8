"""OpenAI chat messages and tools <-> the model's chat template and token ids.

The endpoint (rlvr.rollout.endpoint) renders a request's messages and tools with the tokenizer's
own chat template (``apply_chat_template(messages, tools=..., add_generation_prompt=True)``) and
parses the model's reply back into OpenAI ``tool_calls``.

Tool calls use the Hermes format (Qwen2.5, Qwen3, Hermes 2/3 and other templates that write
them so): the model writes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, a tool's
result comes back inside ``<tool_response>...</tool_response>``. A template that renders tools
itself (its text holds a tool's name when given ``tools=``) gets the messages in the shape
transformers documents (an assistant message's ``tool_calls`` with ``arguments`` as a dict,
``role: tool`` messages). A template that ignores tools (plain ChatML, SmolLM2's) gets the
Hermes layout written into the messages by ``hermes_messages``: the tool list in the system
message (Qwen2.5's wording), tool calls in the assistant's text, tool results as a user turn;
the model then sees tools as a Qwen2.5 model would. Other tool-call formats (Llama 3.1's bare
JSON, Mistral's ``[TOOL_CALLS]``) are not parsed: their replies come back as text.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
TOOL_CALL_STOP = "</tool_call>"
_PROBE_TOOL = "rlvr_probe_tool_name"
_S1, _U = "\x00RLVR_MODEL\x00", "\x00RLVR_USER\x00"

HERMES_SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{tools}\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


class RequestError(ValueError):
    """A request the endpoint refuses (HTTP 400), the message naming what is wrong."""


def content_text(content: Any, where: str) -> str:
    """A message's content as text: a string, None, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if not (isinstance(p, dict) and p.get("type") == "text"):
                raise RequestError(f"{where}: only text content parts are supported, got {p!r}")
            parts.append(str(p.get("text", "")))
        return "".join(parts)
    raise RequestError(f"{where}: content must be a string, null or text parts")


def _arguments(raw: Any, where: str) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            return raw  # kept as the text the model wrote
    return raw


def normalize_messages(messages: Any) -> list[dict]:
    """The request's messages in one comparable shape: role, content text, tool calls as
    (id, name, arguments parsed from JSON), a tool message's tool_call_id and name."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(f"{where}: must be an object with a role")
        role = "system" if m["role"] == "developer" else m["role"]
        msg: dict[str, Any] = {"role": role, "content": content_text(m.get("content"), where)}
        calls = m.get("tool_calls") or []
        if calls:
            msg["tool_calls"] = []
            for c in calls:
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise RequestError(f"{where}: a tool call needs function.name")
                msg["tool_calls"].append(
                    {
                        "id": c.get("id", ""),
                        "name": fn["name"],
                        "arguments": _arguments(fn.get("arguments", {}), where),
                    }
                )
        if role == "tool":
            msg["tool_call_id"] = m.get("tool_call_id", "")
            if m.get("name"):
                msg["name"] = m["name"]
        out.append(msg)
    return out


def same_reply(sent: dict, returned: dict) -> bool:
    """Whether the assistant message an agent sent back is the one the endpoint returned
    (content and tool calls by name and arguments; ids and extra fields are not compared)."""
    if sent.get("role") != "assistant" or sent.get("content", "") != returned.get("content", ""):
        return False
    a = [(c["name"], c["arguments"]) for c in sent.get("tool_calls", [])]
    b = [(c["name"], c["arguments"]) for c in returned.get("tool_calls", [])]
    return a == b


def normalize_tools(tools: Any) -> list[dict]:
    """OpenAI tools (``{"type": "function", "function": {...}}``) as a list of function specs."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise RequestError("tools must be a list")
    out = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RequestError(f"tools[{i}]: must be {{'type': 'function', 'function': {{name}}}}")
        out.append(fn)
    return out


def parse_tool_calls(text: str) -> tuple[str, list[dict]]:
    """(content, tool calls) of a reply in the Hermes format: each ``<tool_call>`` block whose
    JSON has a string ``name`` becomes an OpenAI tool call (``arguments`` a JSON string) and
    leaves the content; a block that is not such JSON stays in the content."""
    calls, kept, last = [], [], 0
    for m in TOOL_CALL.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            continue
        args = obj.get("arguments", obj.get("parameters", {}))
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": obj["name"],
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
        )
        kept.append(text[last : m.start()])
        last = m.end()
    if not calls:
        return text, []
    kept.append(text[last:])
    return "".join(kept).strip(), calls


class ChatFormat:
    """The model's chat template applied to normalized messages, with or without tools."""

    def __init__(self, tokenizer) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "the OpenAI endpoint needs a tokenizer with a chat template (agents talk chat)"
            )
        self.tokenizer = tokenizer
        eos = tokenizer.eos_token_id
        self.eos_id = eos
        self.eos_text = tokenizer.convert_ids_to_tokens(eos) if eos is not None else ""
        self.native_tools = self._renders_tools()
        self.closing = self._assistant_closing()

    def _renders_tools(self) -> bool:
        probe = [{"type": "function", "function": {"name": _PROBE_TOOL, "parameters": {}}}]
        try:
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": "x"}], tools=probe, tokenize=False
            )
        except Exception:  # noqa: BLE001 - a template that refuses tools renders none
            return False
        return _PROBE_TOOL in text

    def _assistant_closing(self) -> str:
        """The text the template writes after an assistant message's content."""
        text = self.render(
            [{"role": "user", "content": _U}, {"role": "assistant", "content": _S1}],
            [],
            generation_prompt=False,
        )
        if _S1 not in text:
            raise ValueError("the chat template drops assistant messages")
        return text.split(_S1, 1)[1]

    def render(self, messages: list[dict], tools: list[dict], *, generation_prompt: bool) -> str:
        """The template's text of normalized ``messages`` (``normalize_messages``) and tools."""
        if self.native_tools:
            msgs = [_native_message(m) for m in messages]
            kwargs = (
                {"tools": [{"type": "function", "function": f} for f in tools]} if tools else {}
            )
        else:
            msgs, kwargs = hermes_messages(messages, tools), {}
        return self.tokenizer.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=generation_prompt, **kwargs
        )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids


def _native_message(m: dict) -> dict:
    out = {"role": m["role"], "content": m["content"]}
    if m.get("tool_calls"):
        out["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for c in m["tool_calls"]
        ]
    for k in ("tool_call_id", "name"):
        if k in m:
            out[k] = m[k]
    return out


def hermes_call_text(call: dict) -> str:
    return (
        "<tool_call>\n"
        + json.dumps({"name": call["name"], "arguments": call["arguments"]})
        + ("\n</tool_call>")
    )


def hermes_messages(messages: list[dict], tools: list[dict]) -> list[dict]:
    """Messages for a template without tool support, in the Hermes layout: the tools in the
    system message, tool calls in the assistant's text, consecutive tool results as one user
    turn of ``<tool_response>`` blocks (as Qwen2.5's template writes them)."""
    out: list[dict] = []
    if tools:
        listing = "".join("\n" + json.dumps({"type": "function", "function": f}) for f in tools)
        block = HERMES_SYSTEM.format(tools=listing)
        if messages and messages[0]["role"] == "system":
            out.append({"role": "system", "content": messages[0]["content"] + "\n\n" + block})
            messages = messages[1:]
        else:
            out.append({"role": "system", "content": block})
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            parts = [m["content"]] if m["content"] else []
            parts += [hermes_call_text(c) for c in m["tool_calls"]]
            out.append({"role": "assistant", "content": "\n".join(parts)})
        elif m["role"] == "tool":
            block = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1].get("_tool"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool": True})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return [{k: v for k, v in m.items() if k != "_tool"} for m in out]
