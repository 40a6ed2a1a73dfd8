"""The sandbox's interface, run for real on every backend that works on this machine:
files in the working folder, stdin, pipes, each limit named in Result.limit."""

from __future__ import annotations

import os

import pytest

from rlvr.config import ConfigError, config_from_dict
from rlvr.sandbox import Limits, SandboxUnavailable, get_sandbox
from rlvr.sandbox.select import reset_cache


def test_files_stdin_and_both_streams_come_back(box):
    r = box.run(
        ["python3", "pkg/main.py"],
        files={
            "pkg/main.py": "import sys, helper\nprint(helper.X + input())\nsys.exit(3)",
            "pkg/helper.py": b"X = 'a'\n",
        },
        stdin="bc\n",
    )
    assert (r.returncode, r.stdout, r.limit, r.timed_out) == (3, "abc\n", None, False)
    assert r.backend == box.name
    r = box.run(["python3", "-c", "import sys; sys.stderr.write('oops')"])
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "oops")


def test_python3_is_the_isolated_interpreter_with_only_the_stdlib(box):
    r = box.run(
        [
            "python3",
            "-c",
            "import sys; print(sys.flags.ignore_environment, sys.flags.no_site)\n"
            "import importlib.util as u; print(u.find_spec('torch'), u.find_spec('rlvr'))",
        ]
    )
    assert r.stdout.split() == ["1", "1", "None", "None"], r


def test_wall_limit_kills_and_says_so(box):
    r = box.run(["python3", "-c", "while True: pass"], limits=Limits(wall_s=1.0))
    assert (r.returncode, r.timed_out, r.limit) == (None, True, "wall")
    assert 0.9 < r.wall_s < 3.0


def test_output_is_cut_and_flagged(box):
    r = box.run(["python3", "-c", "print('x' * 100000)"], limits=Limits(output_bytes=1000))
    assert r.limit == "output" and r.stdout == "x" * 1000


def test_cpu_limit(box):
    code = "import time\nt = time.time()\nwhile time.time() - t < 5: pass"
    r = box.run(["python3", "-c", code], limits=Limits(cpu_s=1, wall_s=8))
    assert r.limit == "cpu" and r.returncode != 0, r


def test_file_names_must_stay_inside_the_folder(box):
    for bad in ("/etc/x", "../x", "a/../../x", ""):
        with pytest.raises(ValueError, match="relative path"):
            box.run(["python3", "-c", "pass"], files={bad: "x"})


def test_limits_refuse_nonpositive_values():
    with pytest.raises(ValueError, match="Limits.memory_mb"):
        Limits(memory_mb=0)


def test_config_section_names_the_bad_backend():
    assert config_from_dict({}).sandbox.backend == "auto"
    assert config_from_dict({"sandbox": {"backend": "my.mod:Remote"}}).sandbox.backend
    with pytest.raises((ConfigError, ValueError), match="sandbox.backend='docker'"):
        config_from_dict({"sandbox": {"backend": "docker"}})


def test_unknown_backend_is_unavailable_with_a_clear_message():
    reset_cache()
    with pytest.raises(SandboxUnavailable, match="not one of auto"):
        get_sandbox("docker")
    with pytest.raises(SandboxUnavailable, match="ModuleNotFoundError"):
        get_sandbox("no_such_module_xyz:Factory")


def test_the_semaphore_bounds_programs_at_once_and_the_wait_is_not_their_time():
    import threading

    from rlvr.config import SandboxConfig
    from rlvr.sandbox import configure

    configure(SandboxConfig(concurrency=2))
    try:
        box = get_sandbox()
        code = "import time\nt = time.time()\ntime.sleep(1.0)\nprint(t, time.time())"
        results = []

        def call() -> None:
            results.append(box.run(["python3", "-c", code], limits=Limits(wall_s=2.5)))

        threads = [threading.Thread(target=call) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # each waited up to ~2 s for a slot, yet none timed out: its 2.5 s began with its program
        assert [r.limit for r in results] == [None] * 6, results
        spans = [tuple(map(float, r.stdout.split())) for r in results]
        most = max(sum(a <= t < b for a, b in spans) for t, _ in spans)
        assert most == 2, spans
    finally:
        configure(SandboxConfig())


def test_a_killed_trainers_sandbox_folder_is_removed_by_the_next_one(tmp_path, monkeypatch):
    """atexit removes a backend's folder at a normal exit; after SIGKILL (a preempted or
    OOM-killed trainer) nothing did, and every such run left one in the temp folder."""
    import subprocess
    import sys
    import tempfile

    from rlvr.sandbox.base import namespace_tag, process_folder

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"rlvr-sandbox-{gone.pid}-{namespace_tag()}-abc"
    (dead / "box").mkdir(parents=True)
    (dead / "box" / "left.txt").write_text("x")
    alive = (
        tmp_path / f"rlvr-sandbox-{os.getppid()}-{namespace_tag()}-def"
    )  # a running process's: kept
    alive.mkdir()
    other = tmp_path / "rlvr-sandbox-notapid"  # not ours to judge: kept
    other.mkdir()
    mine = process_folder("sandbox")
    assert not dead.exists()
    assert alive.exists() and other.exists()
    assert os.path.basename(mine).startswith(f"rlvr-sandbox-{os.getpid()}-")
    assert os.path.dirname(mine) == str(tmp_path)


def _folder_of_a_process_that_is_gone(tmp: str) -> str:
    """The folder ``process_folder`` made in a trainer that then died without its atexit."""
    import subprocess
    import sys

    code = (
        "import tempfile, sys; tempfile.tempdir = sys.argv[1]\n"
        "from rlvr.sandbox.base import process_folder; print(process_folder('sandbox'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, tmp], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_a_folder_named_by_another_host_or_pid_namespace_is_not_judged_by_pid(
    tmp_path, monkeypatch
):
    """A pid is only meaningful in its own pid namespace: a run in another container (its own
    pid namespace) or on another machine sharing the temp folder (TMPDIR on a shared disk) has
    pids this process cannot see, so its live run's folder looked like a dead one's and was
    removed under it."""
    import subprocess
    import sys
    import tempfile

    from rlvr.sandbox.base import process_folder

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ours_gone = _folder_of_a_process_that_is_gone(str(tmp_path))
    assert os.path.isdir(ours_gone)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid no process here has; elsewhere, a live trainer's
    name = os.path.basename(ours_gone)
    pid, _, rest = name[len("rlvr-sandbox-") :].partition("-")
    foreign = tmp_path / f"rlvr-sandbox-{gone.pid}-0000ffff-{rest.rpartition('-')[2]}x"
    foreign.mkdir()
    (foreign / "live.txt").write_text("in use")
    process_folder("sandbox")
    assert not os.path.exists(ours_gone)  # this machine's, this namespace's, its process gone
    assert (foreign / "live.txt").exists()  # another namespace's: kept


def test_a_run_in_its_own_pid_namespace_keeps_its_hands_off_a_live_runs_folder(
    tmp_path, monkeypatch
):
    """Two runs at once, one in a container (its own pid namespace, `unshare --pid`) sharing
    the temp folder: the contained one saw the other's pid as gone and deleted its live
    sandbox folder (every later sandbox call of that run failed)."""
    import shutil
    import subprocess
    import sys
    import tempfile

    from rlvr.sandbox.base import process_folder

    unshare = shutil.which("unshare")
    probe = [unshare, "--pid", "--fork", "--mount-proc", "true"] if unshare else None
    if probe is None or subprocess.run(probe, capture_output=True).returncode != 0:
        pytest.skip("unshare --pid is not available here")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    live = process_folder("sandbox")  # this (live) process's
    code = (
        "import tempfile, sys; tempfile.tempdir = sys.argv[1]\n"
        "from rlvr.sandbox.base import process_folder; process_folder('sandbox')"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run(
        [unshare, "--pid", "--fork", "--mount-proc", sys.executable, "-c", code, str(tmp_path)],
        check=True,
        env=env,
    )
    assert os.path.isdir(live)


@pytest.mark.parametrize("name", ["bwrap", "landlock"])
def test_a_private_temp_folder_does_not_cost_root_the_backend(name, tmp_path, monkeypatch):
    """As root the program runs as uid 65534, which cannot pass a 0700 TMPDIR (a job-private
    temp folder): bwrap failed its probe there (it could not reach its own working folder), so
    ``auto`` fell to the weaker landlock. The backend's folder goes where that uid can reach."""
    import tempfile

    from rlvr.sandbox.select import LOCAL_BACKENDS, _load

    if os.geteuid() != 0:
        pytest.skip("the uid drop to 65534 happens as root")
    try:
        get_sandbox(name)
    except SandboxUnavailable:
        pytest.skip(f"sandbox backend {name} does not run here")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    cls = _load(LOCAL_BACKENDS[name])
    assert cls.probe() is None
    box = cls()
    try:
        r = box.run(["python3", "-c", "open('x', 'w').write('ok'); print(open('x').read())"])
        assert (r.returncode, r.stdout.strip()) == (0, "ok")
    finally:
        box.close()


def test_a_run_in_its_own_pid_namespace_leaves_a_live_runs_cgroups_and_programs(tmp_path):
    """The cgroup twin of the folder test above: a trainer in its own pid namespace sharing
    the cgroup (``unshare --pid``, a container on the host's cgroup) saw a live trainer's
    ``rlvr-sandbox-<pid>`` group as a dead one's, killed the program running in it and removed
    the group; and a process outside its namespace reads as pid 0 in ``cgroup.procs``, so its
    SIGKILL went to its own process group."""
    import shutil
    import signal
    import subprocess
    import sys

    from rlvr.sandbox.cgroup import Cgroups

    unshare = shutil.which("unshare")
    probe = [unshare, "--pid", "--fork", "--mount-proc", "true"] if unshare else None
    if probe is None or subprocess.run(probe, capture_output=True).returncode != 0:
        pytest.skip("unshare --pid is not available here")
    groups = Cgroups.find()
    if groups is None:
        pytest.skip("no writable cgroup here")
    call = groups.new_call(64 * 2**20, 8)
    program = subprocess.Popen(["sleep", "60"])
    try:
        for procs in call.join:
            with open(procs, "w") as f:
                f.write(str(program.pid))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        code = "from rlvr.sandbox.cgroup import Cgroups; Cgroups.find(); print('alive')"
        other = subprocess.run(
            [unshare, "--pid", "--fork", "--mount-proc", sys.executable, "-c", code],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (other.returncode, other.stdout.strip()) == (0, "alive"), other.stderr[-2000:]
        assert program.poll() is None, "the live run's program was killed"
        assert all(os.path.isdir(d) for d in call.dirs.values())
    finally:
        program.send_signal(signal.SIGKILL)
        program.wait()
        call.remove()


def test_the_sweep_judges_only_its_own_namespaces_groups_and_never_pid_0(tmp_path):
    """A group named by another pid namespace (``rlvr-sandbox-<pid>-<other tag>``) is a live
    run's for all this process can tell: its program is left alone. And cgroup v2 lists a
    process outside the reader's pid namespace as 0, which ``kill`` reads as "my own process
    group": such entries are not pids."""
    import signal
    import subprocess

    from rlvr.sandbox.cgroup import CallGroup, _sweep

    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid no process here has
    program = subprocess.Popen(["sleep", "60"])
    try:
        for tag in ("0000ffff", None):  # another namespace's; a name without a tag
            name = f"rlvr-sandbox-{gone.pid}" + (f"-{tag}" if tag else "")
            call = tmp_path / name / "call-0"
            call.mkdir(parents=True)
            (call / "cgroup.procs").write_text(f"{program.pid}\n")
        _sweep(str(tmp_path))
        assert program.poll() is None, "another namespace's program was killed"
        listed = tmp_path / "v2"
        listed.mkdir()
        (listed / "cgroup.procs").write_text(f"0\n{program.pid}\n0\n")
        group = CallGroup({"memory": str(listed), "pids": str(listed)}, True)
        assert group.procs() == [program.pid]
    finally:
        program.send_signal(signal.SIGKILL)
        program.wait()


@pytest.mark.parametrize(
    "module, make",
    [
        ("rlvr.sandbox.landlock", lambda m: m.LandlockSandbox()),
        ("rlvr.sandbox.bwrap", lambda m: m.BwrapSandbox()),
        ("rlvr.rewards.sandbox", lambda m: m.SandboxWorker()),
    ],
)
def test_a_finalizer_at_interpreter_exit_needs_no_module_globals(module, make, monkeypatch):
    """At interpreter exit a module's globals may already be None when an object's ``__del__``
    runs: a test run printed "AttributeError: 'NoneType' object has no attribute 'suppress'"
    from landlock's ``__del__`` (``contextlib.suppress``). The state reproduced: the module's
    globals that ``__del__`` and ``close`` use set to None, then the finalizer called."""
    import importlib

    mod = importlib.import_module(module)
    try:
        obj = make(mod)
    except (RuntimeError, SandboxUnavailable, OSError) as exc:
        pytest.skip(f"{module} does not run here: {exc}")
    try:
        for name in ("contextlib", "shutil", "os", "signal"):
            if hasattr(mod, name):
                monkeypatch.setattr(mod, name, None)
        obj.__del__()  # raised AttributeError on the old code
    finally:
        monkeypatch.undo()
        obj.close()
