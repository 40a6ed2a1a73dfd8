from __future__ import annotations

import io
import json

import pytest

from benchmarks.harness import protocol
from benchmarks.harness.protocol import Gate, encode_event, parse_command, parse_event


def test_event_round_trip_and_plain_lines():
    line = encode_event("step", wall_s=1.5, phases={"generate": 1.0})
    assert line.startswith("@@bench ")
    assert parse_event(line) == {"event": "step", "wall_s": 1.5, "phases": {"generate": 1.0}}
    assert parse_event("{'loss': 0.1}") is None  # a library's own output line
    with pytest.raises(ValueError, match="malformed"):
        parse_event("@@bench {not json")
    with pytest.raises(ValueError, match="kind"):
        encode_event("not a name")


def test_commands():
    assert parse_command('{"cmd": "run", "steps": 3}') == ("run", 3)
    assert parse_command('{"cmd": "stop"}') == ("stop", 0)
    with pytest.raises(ValueError, match="steps >= 1"):
        parse_command('{"cmd": "run", "steps": 0}')
    with pytest.raises(ValueError, match="known: run, stop"):
        parse_command('{"cmd": "pause"}')


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class WaitingStdin(io.StringIO):
    """Each command 'arrives' 100 s after the worker starts waiting for it."""

    def __init__(self, text: str, clock: FakeClock):
        super().__init__(text)
        self.clock = clock

    def readline(self, *args):
        self.clock.now += 100.0
        return super().readline(*args)


def test_gate_times_steps_without_the_waits(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(protocol.time, "perf_counter", clock)
    cmds = "\n".join(
        json.dumps(c) for c in ({"cmd": "run", "steps": 2}, {"cmd": "run", "steps": 1})
    )
    stdin = WaitingStdin(cmds + "\n" + json.dumps({"cmd": "stop"}) + "\n", clock)
    out = io.StringIO()
    gate = Gate(stdin, out)
    assert gate.start(side="x") is True
    clock.now += 5.0
    assert gate.step_done({"n": 1}) is True
    clock.now += 3.0
    assert gate.step_done({"n": 2}) is True  # block of 2 done: pauses, then gets "run 1"
    clock.now += 2.0
    assert gate.step_done({"n": 3}) is False  # block done, then "stop"
    events = [parse_event(line) for line in out.getvalue().splitlines()]
    assert [e["event"] for e in events] == ["ready", "step", "step", "paused", "step", "paused"]
    # the 100 s spent waiting for each command never shows up in a step's wall time
    assert [e["wall_s"] for e in events if e["event"] == "step"] == [5.0, 3.0, 2.0]
    assert gate.stopped and gate.steps_done == 3


def test_gate_stops_when_the_runner_goes_away():
    gate = Gate(io.StringIO(""), io.StringIO())
    assert gate.start() is False
