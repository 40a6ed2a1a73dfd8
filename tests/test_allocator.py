"""train.allocator: which library is found and preferred, what the environment of the restarted
command holds, and (in real processes) that `rlvr train` runs with the malloc it reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.allocator import (
    REEXEC_MARK,
    AllocatorError,
    find_library,
    loaded,
    preload_env,
    resolve,
)
from rlvr.config import ConfigError, load_config


def _lib(d: Path, name: str) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    path = d / name
    path.write_bytes(b"\x7fELF")  # only its presence is looked at
    return path


def test_auto_prefers_tcmalloc_and_falls_back_to_jemalloc_then_the_system(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    je = _lib(a, "libjemalloc.so.2")
    assert resolve("auto", [a, b]) == ("jemalloc", je)
    tc = _lib(b, "libtcmalloc_minimal.so.4")  # in a later folder, still preferred
    assert resolve("auto", [a, b]) == ("tcmalloc", tc)
    assert resolve("jemalloc", [a, b]) == ("jemalloc", je)
    assert resolve("system", [a, b]) == ("system", None)
    assert resolve("auto", [tmp_path / "empty"]) == ("system", None)


def test_the_first_folder_holding_a_library_wins(tmp_path):
    first = _lib(tmp_path / "venv-lib", "libtcmalloc.so.4")
    _lib(tmp_path / "usr-lib", "libtcmalloc_minimal.so.4")
    assert find_library("tcmalloc", [tmp_path / "venv-lib", tmp_path / "usr-lib"]) == first
    assert find_library("jemalloc", [tmp_path / "venv-lib", tmp_path / "usr-lib"]) is None


def test_a_named_library_that_is_missing_is_an_error_saying_how_to_install_it(tmp_path):
    with pytest.raises(AllocatorError) as exc:
        resolve("jemalloc", [tmp_path])
    msg = str(exc.value)
    assert "train.allocator=jemalloc: no libjemalloc.so.2 or libjemalloc.so in " in msg
    assert str(tmp_path) in msg and "apt-get install libjemalloc2" in msg
    with pytest.raises(AllocatorError, match="choose one of auto, tcmalloc, jemalloc, system"):
        resolve("mimalloc", [tmp_path])


def test_the_config_knob_accepts_the_four_values_only():
    assert load_config(None, []).train.allocator == "auto"
    assert load_config(None, ["train.allocator=system"]).train.allocator == "system"
    with pytest.raises(ConfigError, match="train.allocator"):
        load_config(None, ["train.allocator=mimalloc"])


def test_loaded_reads_the_library_from_the_process_maps():
    maps = (
        "7f1c2a000000-7f1c2a021000 r-xp 00000000 fe:01 1234 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        "7f1c2b000000-7f1c2b030000 r-xp 00000000 fe:01 99 "
        "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.10\n"
        "7f1c2c000000-7f1c2c001000 rw-p 00000000 00:00 0 \n"
    )
    # the mapped file is the one the soname links to, with the full version
    assert loaded(maps) == ("tcmalloc", "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.10")
    je = "7f1c2d000000-7f1c2d010000 r-xp 0 fe:01 98 /usr/lib/libjemalloc.so.2\n"
    assert loaded(maps.splitlines(keepends=True)[0] + je) == (
        "jemalloc",
        "/usr/lib/libjemalloc.so.2",
    )
    # a debug build, or a library whose name only starts alike, is not the allocator
    other = "7f1c2e000000-7f1c2e010000 r-xp 0 fe:01 97 /usr/lib/libtcmalloc_minimal_debug.so.4\n"
    assert loaded(other) == ("system", None)
    assert loaded("") == ("system", None)


def test_preload_env_puts_the_library_first_and_keeps_what_was_there():
    env = preload_env(Path("/l/libtcmalloc.so.4"), {"LD_PRELOAD": "/x/a.so:/l/libtcmalloc.so.4"})
    assert env["LD_PRELOAD"] == "/l/libtcmalloc.so.4:/x/a.so"
    assert preload_env(Path("/l/t.so"), {})["LD_PRELOAD"] == "/l/t.so"
    # tcmalloc's report of every allocation above 1 GiB (a model's weights) is silenced
    assert int(env["TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD"]) >= 1 << 40


# ---------------------------------------------------------------- real processes


def _train(
    tiny_model_dir: Path, out: Path, name: str, *extra: str, env: dict | None = None
) -> subprocess.CompletedProcess:
    args = [
        f"model.name_or_path={tiny_model_dir}",
        "data.task=arithmetic",
        "data.num_train=16",
        "data.num_eval=4",
        "algo.group_size=2",
        "algo.prompts_per_step=2",
        "rollout.max_new_tokens=4",
        "train.max_steps=1",
        "train.threads=1",
        "eval.before_after=false",
        "logging.progress=false",
        f"train.output_dir={out}",
        f"train.run_name={name}",
        *extra,
    ]
    return subprocess.run(
        [sys.executable, "-m", "rlvr", "train", *args],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        env=env,
    )


def _summary(out: Path, name: str) -> dict:
    return json.loads((out / name / "summary.json").read_text())


@pytest.mark.skipif(sys.platform != "linux", reason="LD_PRELOAD is Linux's")
def test_rlvr_train_runs_with_the_library_it_found_and_says_so(tiny_model_dir, tmp_path):
    kind, path = resolve("auto")
    if kind == "system":
        pytest.skip("neither tcmalloc nor jemalloc on this machine (make setup installs tcmalloc)")
    proc = _train(tiny_model_dir, tmp_path, "auto")
    assert proc.returncode == 0, proc.stderr
    # summary.json says what /proc/self/maps of the training process held, not what was asked
    mapped = os.path.realpath(path)  # /proc/self/maps names the file the soname links to
    assert _summary(tmp_path, "auto")["allocator"] == f"{kind} ({mapped}), train.allocator=auto"
    assert f"[rlvr] malloc: {kind} ({mapped})" in proc.stdout

    proc = _train(tiny_model_dir, tmp_path, "system", "train.allocator=system")
    assert proc.returncode == 0, proc.stderr
    assert _summary(tmp_path, "system")["allocator"] == "system malloc, train.allocator=system"


@pytest.mark.skipif(sys.platform != "linux", reason="LD_PRELOAD is Linux's")
def test_a_missing_named_library_stops_the_command_before_any_work(tiny_model_dir, tmp_path):
    kind = next((k for k in ("jemalloc", "tcmalloc") if find_library(k) is None), None)
    if kind is None:
        pytest.skip("both libraries are installed here")
    proc = _train(tiny_model_dir, tmp_path, "missing", f"train.allocator={kind}")
    assert proc.returncode == 2
    assert f"rlvr: train.allocator={kind}: no lib{kind}" in proc.stderr
    assert not (tmp_path / "missing").exists()


def test_a_restarted_command_that_still_lacks_the_library_goes_on_with_the_system_malloc(
    tiny_model_dir, tmp_path
):
    """ld.so refuses a library it cannot load (and says so); the command must not start itself
    again and again: with the restart mark set it runs on with glibc's malloc."""
    kind, _ = resolve("auto")
    if kind == "system":
        pytest.skip("neither tcmalloc nor jemalloc on this machine")
    env = {**os.environ, REEXEC_MARK: kind}
    env.pop("LD_PRELOAD", None)
    proc = _train(tiny_model_dir, tmp_path, "marked", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "could not be preloaded; using the system malloc" in proc.stdout
    assert _summary(tmp_path, "marked")["allocator"].startswith("system malloc")


def test_doctor_names_the_malloc_rlvr_train_would_preload(capsys):
    from rlvr.cli.doctor import run_doctor

    run_doctor()
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("malloc"))
    kind, lib = resolve("auto")
    assert line.split(None, 1)[1] == (
        f"{kind}: {lib} (rlvr train/eval preload it)" if lib else "system (glibc)"
    )


def test_rlvr_train_reaches_the_restart_without_importing_torch():
    """The restart replaces the process: whatever was imported before it is imported twice.
    Parsing the command line and the config must stay free of torch (~2 s here)."""
    code = (
        "import sys\n"
        "from rlvr.cli.main import build_parser, parse_args_any_order, _train_config\n"
        "args = parse_args_any_order(build_parser(), ['train', 'train.max_steps=3'])\n"
        "_train_config(args)\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------- oneDNN's primitive cache


def test_onednn_bound_sets_the_capacity_unless_the_environment_has_one():
    from rlvr import onednn_cache

    env: dict[str, str] = {}
    onednn_cache.bound(256, env)
    assert env == {onednn_cache.ENV: "256"} and onednn_cache.in_effect(env) == "256"
    env = {onednn_cache.ENV: "64"}
    onednn_cache.bound(256, env)  # the user's own value wins
    assert env == {onednn_cache.ENV: "64"}
    env = {}
    onednn_cache.bound(0, env)  # 0: oneDNN's default, nothing set
    assert env == {} and onednn_cache.in_effect(env) == "1024 (oneDNN default)"


def test_rlvr_train_bounds_onednn_cache_and_reports_it(tiny_model_dir, tmp_path):
    from rlvr import onednn_cache

    env = {k: v for k, v in os.environ.items() if k != onednn_cache.ENV}
    proc = _train(tiny_model_dir, tmp_path, "default", env=env)
    assert proc.returncode == 0, proc.stderr
    assert _summary(tmp_path, "default")["onednn_primitive_cache"] == "256"
    assert "oneDNN primitive cache: 256" in proc.stdout
    proc = _train(tiny_model_dir, tmp_path, "off", "train.onednn_cache=0", env=env)
    assert proc.returncode == 0, proc.stderr
    assert _summary(tmp_path, "off")["onednn_primitive_cache"] == "1024 (oneDNN default)"
    proc = _train(tiny_model_dir, tmp_path, "user", env={**env, onednn_cache.ENV: "64"})
    assert proc.returncode == 0, proc.stderr
    assert _summary(tmp_path, "user")["onednn_primitive_cache"] == "64"


def test_allocator_env_preloads_what_resolve_finds_and_nothing_for_system():
    from rlvr.allocator import allocator_env

    env = {"LD_PRELOAD": "/opt/other.so", "PATH": "/bin"}
    assert allocator_env("system", env) == env
    kind, path = resolve("auto")
    got = allocator_env("auto", env)
    if kind == "system":
        assert got == env
    else:
        assert got["LD_PRELOAD"] == f"{path}:/opt/other.so" and got["PATH"] == "/bin"
