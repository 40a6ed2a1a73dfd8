"""The attack suite (issue #58): every program of tests/sandbox/attacks.py run through the
project's entry point (env_factory("python")'s step(), under call_all as episodes run it) and
straight through each strong backend that works here, each one refused or contained.

After every attack the trainer (this test process) checks from outside: its planted files
(hashes), its environment, a canary in its memory, that no SIGUSR1 reached it, that nothing
connected to its listeners, that no process of the attack outlived the call, and that nothing
appeared in /tmp. The programs also print ``ESCAPED: ...`` for any step that worked.
"""

from __future__ import annotations

import base64
import ctypes
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from attacks import ATTACKS, LIMITED, NATIVE_EXTENSION_C, NATIVE_LOADER, PREAMBLE, program

from rlvr.envs import env_factory
from rlvr.envs.contain import call_all
from rlvr.sandbox import Limits, get_sandbox
from sandbox.conftest import available

STRONG = [name for name in ("bwrap", "landlock") if available(name) is not None]
SECRET_VALUE = "sk-rlvr-canary-4f1d2c"
TOKEN_VALUE = "hf_rlvrFAKEtoken0123456789"
ANSWER_VALUE = "reference-answer-73519"
CANARY = b"rlvr-canary-" + os.urandom(8).hex().encode()
OWNED = ("/tmp/rlvr-owned", "/tmp/rlvr-native-owned", "/tmp/rlvr-native-id")

DIRECT = Limits(wall_s=3, cpu_s=3, memory_mb=128, processes=16, files=64, write_bytes=4 * 2**20)
TOOL = {"timeout_s": 3.0, "memory_mb": 128, "max_output_chars": 20000}


def _tree_hashes(root: Path) -> dict[str, str]:
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        data = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
        xattrs = ""
        if not path.is_symlink():
            xattrs = ",".join(sorted(os.listxattr(path)))
        out[str(path)] = f"{oct(st.st_mode)}:{hashlib.sha256(data).hexdigest()}:{xattrs}"
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Trainer:
    """What the attacks aim at, planted in this process and a temporary tree."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.tree = root / "run"
        self.tree.mkdir()
        (self.tree / "planted.txt").write_text("the trainer's file")
        (self.tree / "rewards.py").write_text("def reward(): return 0.0\n")
        self.dataset = self.tree / "train.jsonl"
        self.dataset.write_text(json.dumps({"prompt": "2+2?", "answer": ANSWER_VALUE}) + "\n")
        self.home = root / "home"
        token = self.home / ".cache" / "huggingface" / "token"
        token.parent.mkdir(parents=True)
        token.write_text(TOKEN_VALUE)
        for p in [root, self.tree, self.home, *self.home.rglob("*"), *self.tree.rglob("*")]:
            p.chmod(
                0o755 if p.is_dir() else 0o644
            )  # world-readable: the sandbox must still not see them
        self.canary = ctypes.create_string_buffer(CANARY)
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(8)
        self.tcp.setblocking(False)
        self.unix_path = str(root / "trainer.sock")
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(self.unix_path)
        os.chmod(self.unix_path, 0o777)
        self.unix.listen(8)
        self.unix.setblocking(False)
        self.abstract = f"rlvr-trainer-{os.getpid()}"
        self.abs = socket.socket(socket.AF_UNIX)
        self.abs.bind("\0" + self.abstract)
        self.abs.listen(8)
        self.abs.setblocking(False)
        self.usr1 = 0
        self.real_home = os.path.expanduser("~")
        self.marker = f"rlvr-attack-marker-{os.urandom(4).hex()}"

    def coords(self, files: int, write_bytes: int, memory_mb: int) -> str:
        return json.dumps(
            {
                "pid": os.getpid(),
                "pgid": os.getpgid(0),
                "port": self.tcp.getsockname()[1],
                "free_port": _free_port(),
                "unix": self.unix_path,
                "abstract": self.abstract,
                "home": str(self.home),
                "tree": str(self.tree),
                "cwd": os.getcwd(),
                "real_home": self.real_home,
                "dataset": str(self.dataset),
                "secret_value": SECRET_VALUE,
                "canary_addr": ctypes.addressof(self.canary),
                "marker": self.marker,
                "files": files,
                "write_bytes": write_bytes,
                "memory_mb": memory_mb,
            }
        )

    def close(self) -> None:
        for s in (self.tcp, self.unix, self.abs):
            s.close()


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    t = Trainer(tmp_path_factory.mktemp("trainer"))
    yield t
    t.close()


@pytest.fixture
def watched(trainer, monkeypatch):
    """The trainer's state before an attack, checked unchanged after it."""
    monkeypatch.setenv("RLVR_FAKE_API_KEY", SECRET_VALUE)
    monkeypatch.setenv("HOME", str(trainer.home))

    def on_usr1(signum, frame):
        trainer.usr1 += 1

    old = signal.signal(signal.SIGUSR1, on_usr1)
    for path in OWNED:
        if os.path.exists(path):
            os.remove(path)
    hashes = _tree_hashes(trainer.root)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    yield trainer
    signal.signal(signal.SIGUSR1, old)
    assert _tree_hashes(trainer.root) == hashes, "the trainer's files changed"
    now = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    assert now == env, "the trainer's environment changed"
    assert trainer.canary.raw[: len(CANARY)] == CANARY, "the trainer's memory changed"
    assert trainer.usr1 == 0, "SIGUSR1 reached the trainer"
    for s in (trainer.tcp, trainer.unix, trainer.abs):
        with pytest.raises(BlockingIOError):
            s.accept()[0].close()
    assert not [p for p in OWNED if os.path.exists(p)], "a file appeared outside the sandbox"
    deadline = time.monotonic() + 2.0
    while (left := _marker_processes(trainer.marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"attack processes outlived the call: {left}"


def _marker_processes(marker: str) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    out.append(int(pid))
            except OSError:
                continue
    return out


# What a backend lets through by design, and says so in docs/sandbox.md: the landlock fallback
# has no tmpfs to cap the file count (the files are counted after the call and flagged "files")
# and no noexec folder (a library the program writes loads, under the same Landlock and seccomp
# rules: it can do nothing the program could not). Every other line of the suite holds.
KNOWN_GAPS = {
    ("landlock", "many_files_fast"): "ESCAPED: more files than the limit",
    ("landlock", "native"): "ESCAPED: load a native extension it wrote",
}


def _assert_contained(
    name: str, text: str, limit: str | None, check_limit: bool = True, backend: str = ""
) -> None:
    gap = KNOWN_GAPS.get((backend, name))
    escaped = [line for line in text.splitlines() if line.startswith("ESCAPED")]
    assert all(gap and line.startswith(gap) for line in escaped), text[-3000:]
    for value in (SECRET_VALUE, TOKEN_VALUE, ANSWER_VALUE):
        assert value not in text, f"{name}: {value} leaked"
    want = LIMITED.get(name)
    if want is not None and check_limit:
        assert limit in ({want} if isinstance(want, str) else want), (name, limit, text[-500:])


@pytest.mark.parametrize("backend", STRONG)
@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_straight_through_the_sandbox(name, backend, watched):
    box = get_sandbox(backend)
    code = program(name, watched.coords(DIRECT.files, DIRECT.write_bytes, DIRECT.memory_mb))
    probe = _listener_probe(name, code)
    r = box.run(["python3", "attack.py"], files={"attack.py": code}, limits=DIRECT)
    reached = probe() if probe else False
    assert not reached, "the trainer reached the sandbox's 127.0.0.1 listener"
    _assert_contained(name, r.stdout + r.stderr, r.limit, backend=backend)
    if name == "huge_output":
        assert len(r.stdout) == DIRECT.output_bytes
    if name == "many_files_fast" and backend == "bwrap":
        assert "made 63" in r.stdout or "stopped at 63" in r.stdout, (
            r.stdout
        )  # 64 inodes, the script 1


@pytest.mark.parametrize("backend", STRONG)
@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_through_the_python_tool(name, backend, watched):
    from rlvr.sandbox import default_limits

    limits = default_limits()
    code = program(name, watched.coords(limits.files, limits.write_bytes, TOOL["memory_mb"]))
    env = env_factory("python", {**TOOL, "sandbox": backend})()
    env.reset({"prompt": "q"})
    probe = _listener_probe(name, code)
    (out,) = call_all([lambda: env.step(f"<python>{code}</python>")], 30.0)
    reached = probe() if probe else False
    assert not reached, "the trainer reached the sandbox's 127.0.0.1 listener"
    assert out.ok, out.error  # contained: the episode goes on
    text = out.value[0]
    notes = {
        "memory": "[memory limit:",
        "wall": "[timed out after",
        "processes": "[timed out after",
        "cpu": "[CPU time limit:",
        "files": "[file limit:",
        "write": "[write limit:",
        "output": "[output truncated]",
    }
    want = LIMITED.get(name)
    _assert_contained(name, text, None, check_limit=False, backend=backend)
    if want is not None and (backend, name) not in KNOWN_GAPS:
        wanted = {want} if isinstance(want, str) else want
        assert any(notes[w] in text for w in wanted), (name, text[-500:])


def _listener_probe(name: str, code: str):
    """For the listener attack: a thread that keeps trying the sandbox's port from outside."""
    if name != "listener_on_127001":
        return None
    port = json.loads(code.split("json.loads(", 1)[1].split(")\n", 1)[0].strip("'\""))["free_port"]
    reached = []

    def knock() -> None:
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                reached.append(True)
                return
            except OSError:
                time.sleep(0.05)

    thread = threading.Thread(target=knock, daemon=True)
    thread.start()

    def result() -> bool:
        thread.join()
        return bool(reached)

    return result


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no C compiler to build the extension")
@pytest.mark.skipif(not STRONG, reason="no strong sandbox backend runs here")
def test_a_native_extension_it_wrote_is_not_loaded(tmp_path, watched):
    src = tmp_path / "evil.c"
    src.write_text(NATIVE_EXTENSION_C)
    so = tmp_path / "evil.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    blob = base64.b64encode(so.read_bytes()).decode()
    code = (
        PREAMBLE.format(coords=watched.coords(64, 2**20, 128))
        + f"import base64\nopen('evil.so', 'wb').write(base64.b64decode({blob!r}))\n"
        + NATIVE_LOADER
    )
    for backend in STRONG:
        r = get_sandbox(backend).run(["python3", "a.py"], files={"a.py": code}, limits=DIRECT)
        _assert_contained("native", r.stdout + r.stderr, r.limit, backend=backend)
    env = env_factory("python", TOOL)()
    (out,) = call_all([lambda: env.step(f"<python>{code}</python>")], 30.0)
    assert out.ok, out.error
    _assert_contained("native", out.value[0], None, check_limit=False)


def test_the_default_backend_is_not_the_unsafe_one():
    # a fresh clone after `make setup` (which installs bubblewrap and libseccomp as root)
    box = get_sandbox("auto")
    assert box.name != "unsafe_local"
    assert box.name in ("bwrap", "landlock")


def test_per_call_overhead_is_printed(capsys):
    """Measured, not asserted: the wall time of a call that does nothing, per backend."""
    lines = []
    for name in (*STRONG, "unsafe_local"):
        box = get_sandbox(name)
        box.run(["python3", "-c", "pass"])
        times = []
        for _ in range(10):
            t = time.perf_counter()
            r = box.run(["python3", "-c", "pass"])
            times.append(time.perf_counter() - t)
            assert r.returncode == 0
        times.sort()
        lines.append(
            f"{name}: median {times[5] * 1000:.0f} ms, min {times[0] * 1000:.0f} ms a call"
        )
    with capsys.disabled():
        print("\n[sandbox overhead] " + "; ".join(lines))
