"""An OpenAI-compatible endpoint in front of an rlvr engine, recording every token it samples.

Agents written against a chat completions API train on rlvr's engines through it: each episode
gets a base URL ``http://127.0.0.1:PORT/episodes/<key>/v1``, so an unmodified OpenAI client works
(``OpenAI(base_url=..., api_key="rlvr")``). Routes under it: ``POST /chat/completions``,
``POST /completions``, ``GET /models``.

Token in, token out (docs/environments.md, "Agents"): the endpoint renders a request's prompt
ids itself (chat: the model's chat template, rlvr.rollout.chat_format) and records, per episode,
the prompt ids of each call and the exact ids and log-probs the engine sampled. A follow-up whose
history is the previous call's plus the reply the endpoint returned (same messages, the assistant
message unchanged) is rendered as the previous call's ids, the sampled ids as they are (never
decoded and encoded again, whatever the template would write for that reply), the template's
closing of the assistant turn, then the new messages: its prompt extends the previous response
and the episode grows as one sequence (the sampled tokens trained with their log-probs, the rest
masked). Otherwise (a dropped or edited message, a template that rewrites earlier turns) the
prompt is the rendered text encoded, and the episode splits: a new sequence starts from that
prompt (``EpisodeLog.splits``).

Requests from several agents are batched: the first waits at most ``window_s`` for others (or
until every open episode has a request waiting), then one ``engine.generate`` call serves them.
Sampling is rlvr's (``rollout.temperature``, ``top_p``, ``top_k``: the trainer's log-probs are
taken at that temperature): a request's own temperature is ignored; ``max_tokens`` is capped by
``rollout.max_new_tokens`` and the episode's token budget; ``stop`` strings are honoured.
Refused with HTTP 400: ``stream``, ``n`` > 1, more calls than ``max_calls``, a prompt past the
context. The server is the standard library's ``ThreadingHTTPServer`` in a daemon thread on
127.0.0.1 and an ephemeral port: no streaming or async stack is needed for JSON requests and
replies, and it works in every install of rlvr, without the web extras.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rlvr.rollout.base import SamplingParams
from rlvr.rollout.chat_format import (
    ChatFormat,
    RequestError,
    normalize_messages,
    normalize_tools,
    parse_tool_calls,
    same_reply,
)


@dataclass
class Sequence:
    """One trained sequence of an episode: its prompt, then every token after it (the model's
    with loss mask 1 and their log-probs, the rest 0)."""

    prompt: list[int]
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    calls: int = 0  # model turns in it
    finish: str = "stop"
    text: str = ""  # the last reply's text (what a reward spec would grade)

    @property
    def full(self) -> list[int]:
        return self.prompt + self.ids


@dataclass
class _Call:
    """What a follow-up must repeat to extend this call (chat: messages and reply; completions:
    the prompt text and the text returned)."""

    kind: str
    messages: list[dict] | None
    tools: list[dict] | None
    reply: dict | None
    prompt_text: str
    returned_text: str
    ended_with_eos: bool


@dataclass
class EpisodeLog:
    """Everything the endpoint served one episode."""

    key: str
    sequences: list[Sequence] = field(default_factory=list)
    calls: int = 0
    splits: int = 0  # sequences started after the first (the agent rewrote its history)
    refused: list[str] = field(default_factory=list)  # why requests were refused (HTTP 400)
    tool_calls: int = 0
    last: _Call | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, prompt: list[int], ids: list[int], logprobs: list[float], finish: str) -> None:
        """One sampled reply to ``prompt``: the current sequence grows when ``prompt`` extends its
        full ids, else a new sequence starts."""
        cur = self.sequences[-1] if self.sequences else None
        if cur is not None and prompt[: len(cur.full)] == cur.full:
            extra = prompt[len(cur.full) :]
            cur.ids += extra
            cur.mask += [0] * len(extra)
            cur.logprobs += [0.0] * len(extra)
        else:
            if cur is not None:
                self.splits += 1
            cur = Sequence(list(prompt))
            self.sequences.append(cur)
        cur.ids += ids
        cur.mask += [1] * len(ids)
        cur.logprobs += list(logprobs)
        cur.calls += 1
        cur.finish = finish


@dataclass
class EndpointLimits:
    max_new_tokens: int  # rollout.max_new_tokens: most tokens per call
    max_sequence_tokens: int  # rollout.max_episode_tokens: most tokens after a sequence's prompt
    max_prompt_tokens: int  # the longest prompt a call may send (context minus one turn)
    max_calls: int  # rollout.max_turns: most calls per episode


@dataclass
class _Pending:
    episode: EpisodeLog
    prompt: list[int]
    max_tokens: int
    stop: tuple[str, ...]
    seed: int | None
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: str = ""
    ended: bool = False  # refused: its episode ended before the engine served it


class Endpoint:
    """The server and its engine; ``open(key)`` makes an episode and returns its base URL."""

    def __init__(
        self,
        engine,
        tokenizer,
        params: SamplingParams,
        limits: EndpointLimits,
        *,
        window_s: float = 0.05,
        model_name: str = "rlvr-policy",
    ) -> None:
        self.engine, self.tokenizer = engine, tokenizer
        self.chat = ChatFormat(tokenizer)
        self.params, self.limits, self.window_s = params, limits, window_s
        self.model_name = model_name
        self.episodes: dict[str, EpisodeLog] = {}
        self._open: set[str] = set()
        self._queue: list[_Pending] = []
        self._cv = threading.Condition()
        self._closed = False
        self._serving = False  # the batch loop is in engine.generate
        self._seed_counter = 0
        self.generate_calls = 0  # engine.generate calls made (batching shows in it)
        self._server = _Server(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._threads = [
            threading.Thread(target=self._server.serve_forever, daemon=True, name="rlvr-endpoint"),
            threading.Thread(target=self._batch_loop, daemon=True, name="rlvr-endpoint-batch"),
        ]
        for t in self._threads:
            t.start()

    # ------------------------------------------------------------------ episodes
    def set_params(self, params: SamplingParams) -> None:
        """The sampling of the next requests (a step's seed and rlvr's sampling knobs)."""
        with self._cv:
            self.params, self._seed_counter = params, 0

    def open(self, key: str | None = None) -> tuple[str, EpisodeLog]:
        """A new episode: (its base URL, its log)."""
        key = key or uuid.uuid4().hex
        log = EpisodeLog(key)
        with self._cv:
            if key in self.episodes:
                raise ValueError(f"episode key {key!r} is already open")
            self.episodes[key] = log
            self._open.add(key)
        return f"http://127.0.0.1:{self.port}/episodes/{key}/v1", log

    def finish(self, key: str) -> EpisodeLog:
        """The episode ends: later requests to it are refused (an agent past its time), and its
        requests still waiting for the engine are refused, never generated."""
        with self._cv:
            self._open.discard(key)
            kept = []
            for p in self._queue:
                if p.episode.key == key:
                    p.error, p.ended = f"episode {key!r} has ended", True
                    p.done.set()
                else:
                    kept.append(p)
            self._queue = kept
            self._cv.notify_all()
            return self.episodes.pop(key)

    def wait_idle(self) -> None:
        """Until no engine.generate call of the endpoint is under way. The engine may be the
        trainer's own module (the hf engine decodes with it, its linear layers swapped for packed
        copies meanwhile): the step goes on to the update or a checkpoint only after this."""
        with self._cv:
            while self._serving:
                self._cv.wait()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._server.shutdown()
        self._server.server_close()

    # ------------------------------------------------------------------ requests
    def chat_completion(self, log: EpisodeLog, body: dict) -> dict:
        _check_common(body)
        messages = normalize_messages(body.get("messages"))
        tools = normalize_tools(body.get("tools"))
        if body.get("tool_choice") not in (None, "auto", "none"):
            raise RequestError("tool_choice: only 'auto' and 'none' are supported")
        text = self.chat.render(messages, tools, generation_prompt=True)
        prompt = self._chat_prompt(log, messages, tools, text)
        comp, stop = self._sample(log, prompt, body)
        raw = self.tokenizer.decode(comp.token_ids, skip_special_tokens=True)
        content = _strip_stop(raw, stop) if comp.finish_reason == "stop" else raw
        content, calls = parse_tool_calls(content) if tools else (content, [])
        finish = "tool_calls" if calls else comp.finish_reason
        message = {"role": "assistant", "content": content or (None if calls else "")}
        if calls:
            message["tool_calls"] = calls
        with log.lock:
            log.tool_calls += len(calls)
            log.last = _Call(
                "chat",
                messages,
                tools,
                normalize_messages([message])[0],
                text,
                "",
                bool(comp.token_ids) and comp.token_ids[-1] == self.chat.eos_id,
            )
        return self._response("chat.completion", prompt, comp, {"message": message}, finish)

    def completion(self, log: EpisodeLog, body: dict) -> dict:
        _check_common(body)
        raw = body.get("prompt")
        if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], (str, list)):
            raw = raw[0]
        if isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw):
            prompt, text = list(raw), None
        elif isinstance(raw, str) and raw:
            text = raw
            prompt = self._completion_prompt(log, raw)
        else:
            raise RequestError("prompt must be a non-empty string or a list of token ids")
        comp, stop = self._sample(log, prompt, body)
        out = self.tokenizer.decode(comp.token_ids, skip_special_tokens=False)
        if comp.finish_reason == "stop":
            out = _strip_stop(out, stop)
        with log.lock:
            log.last = _Call("completion", None, None, None, text or "", out, False)
        return self._response("text_completion", prompt, comp, {"text": out}, comp.finish_reason)

    def _chat_prompt(self, log: EpisodeLog, messages, tools, text: str) -> list[int]:
        """The prompt ids of a chat request: the previous call's ids, its sampled ids and the
        new turns where the request continues the episode's history unchanged; the rendered
        text encoded otherwise."""
        prev = log.last
        seq = log.sequences[-1] if log.sequences else None
        if prev is not None and prev.kind == "chat" and seq is not None:
            n = len(prev.messages)
            if (
                tools == prev.tools
                and len(messages) > n
                and messages[:n] == prev.messages
                and same_reply(messages[n], prev.reply)
            ):
                upto = self.chat.render(messages[: n + 1], tools, generation_prompt=False)
                closing, eos = self.chat.closing, self.chat.eos_text
                if (
                    text.startswith(upto)
                    and upto.startswith(prev.prompt_text)
                    and upto.endswith(closing)
                ):
                    if prev.ended_with_eos and eos and closing.startswith(eos):
                        closing = closing[len(eos) :]
                    return seq.full + self.chat.encode(closing + text[len(upto) :])
        return self.chat.encode(text)

    def _completion_prompt(self, log: EpisodeLog, text: str) -> list[int]:
        prev = log.last
        seq = log.sequences[-1] if log.sequences else None
        if prev is not None and prev.kind == "completion" and seq is not None:
            before = prev.prompt_text + prev.returned_text
            if prev.prompt_text and text.startswith(before):
                return seq.full + self.chat.encode(text[len(before) :])
        return self.chat.encode(text)

    def _sample(self, log: EpisodeLog, prompt: list[int], body: dict):
        lim = self.limits
        with log.lock:
            if log.calls >= lim.max_calls:
                raise RequestError(f"the episode made rollout.max_turns={lim.max_calls} calls")
            seq = log.sequences[-1] if log.sequences else None
            extends = seq is not None and prompt[: len(seq.full)] == seq.full
            room = lim.max_sequence_tokens - (len(prompt) - len(seq.prompt) if extends else 0)
            if not extends and len(prompt) > lim.max_prompt_tokens:
                raise RequestError(
                    f"a prompt of {len(prompt)} tokens is over the {lim.max_prompt_tokens} a "
                    "call may send (data.max_prompt_tokens + rollout.max_episode_tokens)"
                )
            if room <= 0:
                raise RequestError(
                    f"the episode's sequence used its rollout.max_episode_tokens="
                    f"{lim.max_sequence_tokens} tokens"
                )
            log.calls += 1
        asked = body.get("max_completion_tokens") or body.get("max_tokens") or lim.max_new_tokens
        if not isinstance(asked, int) or asked <= 0:
            raise RequestError(f"max_tokens must be a positive integer, got {asked!r}")
        stop = body.get("stop") or ()
        stop = (stop,) if isinstance(stop, str) else tuple(stop)
        stop = tuple(dict.fromkeys(stop + tuple(self.params.stop)))
        pending = _Pending(log, prompt, min(asked, lim.max_new_tokens, room), stop, None)
        with self._cv:
            if self._closed or log.key not in self._open:
                raise RequestError(f"episode {log.key!r} has ended")
            self._queue.append(pending)
            self._cv.notify_all()
        pending.done.wait()
        if pending.ended:
            raise RequestError(pending.error)
        if pending.error:
            raise RuntimeError(pending.error)
        comp = pending.result
        with log.lock:
            log.add(prompt, list(comp.token_ids), list(comp.logprobs), comp.finish_reason)
            log.sequences[-1].text = comp.text
        return comp, stop

    def _response(self, obj: str, prompt, comp, choice: dict, finish: str) -> dict:
        return {
            "id": f"rlvr-{uuid.uuid4().hex[:16]}",
            "object": obj,
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [{"index": 0, **choice, "logprobs": None, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(comp.token_ids),
                "total_tokens": len(prompt) + len(comp.token_ids),
            },
        }

    # ------------------------------------------------------------------ batching
    def _batch_loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if self._closed:
                    for p in self._queue:
                        p.error = "the endpoint closed"
                        p.done.set()
                    return
                deadline = time.monotonic() + self.window_s
                # wait for the other open episodes' requests, at most window_s
                while len(self._queue) < len(self._open) and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cv.wait(left)
                batch, self._queue = self._queue, []
                params = self.params
                self._serving = True
            try:
                self._serve(batch, params)
            finally:
                with self._cv:
                    self._serving = False
                    self._cv.notify_all()

    def _serve(self, batch: list[_Pending], params: SamplingParams) -> None:
        by_shape: dict[tuple, list[_Pending]] = {}
        for p in batch:
            by_shape.setdefault((p.max_tokens, p.stop), []).append(p)
        for (max_tokens, stop), group in by_shape.items():
            seeds = None
            if params.prompt_seeds is not None or params.seed is not None:
                base = params.seed if params.seed is not None else params.prompt_seeds[0]
                first = self._seed_counter
                self._seed_counter += len(group)
                seeds = tuple(base * 31 + 1009 * (first + i) for i in range(len(group)))
            p = dataclasses.replace(
                params,
                n=1,
                max_new_tokens=max_tokens,
                stop=stop,
                prompt_seeds=seeds if params.prompt_seeds is not None else None,
                seed=None if params.seed is None else seeds[0],
            )
            try:
                out = self.engine.generate([q.prompt for q in group], p)
                self.generate_calls += 1
                for q, comps in zip(group, out, strict=True):
                    q.result = comps[0]
            except Exception as exc:  # noqa: BLE001 - the agents get the error, the loop lives
                for q in group:
                    q.error = f"the engine failed: {type(exc).__name__}: {exc}"
            for q in group:
                q.done.set()


class _Server(ThreadingHTTPServer):
    # a step's agents connect at once: the standard library's listen backlog of 5 dropped most
    # of 32 simultaneous connections on a loaded machine (their clients timed out or were reset)
    request_queue_size = 1024


def _check_common(body: dict) -> None:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    if body.get("stream"):
        raise RequestError("stream=true is not supported: ask for the whole reply")
    if body.get("n", 1) != 1:
        raise RequestError(f"n={body.get('n')}: one choice per request (run n agents instead)")


def _strip_stop(text: str, stop: tuple[str, ...]) -> str:
    """OpenAI leaves the matched stop string out of the reply text; the tool-call stop
    ``</tool_call>`` is kept so that the call parses."""
    for s in stop:
        if s and text.endswith(s) and s != "</tool_call>":
            return text[: -len(s)]
    return text


def _handler(endpoint: Endpoint):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet: the run's log is not an access log
            pass

        def _reply(self, code: int, obj: dict) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, code: int, message: str, log: EpisodeLog | None = None) -> None:
            if log is not None:
                with log.lock:
                    log.refused.append(message)
            kind = "invalid_request_error" if code < 500 else "server_error"
            self._reply(code, {"error": {"message": message, "type": kind, "code": code}})

        def _route(self) -> tuple[EpisodeLog | None, str]:
            parts = self.path.split("?", 1)[0].strip("/").split("/")
            if len(parts) < 4 or parts[0] != "episodes" or parts[2] != "v1":
                return None, ""
            return endpoint.episodes.get(parts[1]), "/".join(parts[3:])

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            log, route = self._route()
            if log is None:
                return self._error(404, f"no open episode at {self.path}")
            if route == "models":
                model = {"id": endpoint.model_name, "object": "model", "owned_by": "rlvr"}
                return self._reply(200, {"object": "list", "data": [model]})
            return self._error(404, f"no route GET {self.path}")

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            log, route = self._route()
            if log is None:
                return self._error(404, f"no open episode at {self.path}")
            try:
                body = json.loads(raw or b"{}")
            except json.JSONDecodeError as exc:
                return self._error(400, f"the body is not JSON: {exc}", log)
            try:
                if route == "chat/completions":
                    out = endpoint.chat_completion(log, body)
                elif route == "completions":
                    out = endpoint.completion(log, body)
                else:
                    return self._error(404, f"no route POST {self.path}", log)
            except RequestError as exc:
                return self._error(400, str(exc), log)
            except Exception as exc:  # noqa: BLE001 - the agent sees a server error
                return self._error(500, f"{type(exc).__name__}: {exc}", log)
            self._reply(200, out)

    return Handler
