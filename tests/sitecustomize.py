"""Test hooks for the Python processes the suite starts (``rlvr train`` children, the fork server).

``tests/conftest.py`` puts ``tests/`` on every child's ``PYTHONPATH``, so Python imports this
module at start-up (``sitecustomize``, see the ``site`` docs). It changes nothing unless the
suite asked for it, and it keeps test switches out of ``src/``:

* ``RLVR_TEST_HF_ENGINE=1``: ``rollout.engine=auto`` picks the transformers engine even where
  vLLM is installed (tests outside ``tests/rollout`` behave the same with and without vLLM).
* ``RLVR_TEST_HOOKS=module:function``: the function is called once ``rlvr.training.trainer`` is
  imported (test probes in processes the suite does not fork itself: torchrun's ranks).
* ``RLVR_TEST_SLOW_SAVE=<seconds>``: every checkpoint write sleeps that long after its files are
  written and before they are fsynced and marked COMPLETE, so a kill can land inside a save.

Both are applied when ``rlvr.training.setup`` / ``rlvr.checkpoint.full`` is imported, by
wrapping the module's loader: importing them here would slow every child's start.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import time

HF_ENGINE_ENV = "RLVR_TEST_HF_ENGINE"
SLOW_SAVE_ENV = "RLVR_TEST_SLOW_SAVE"
HOOKS_ENV = "RLVR_TEST_HOOKS"


def no_vllm(module) -> None:
    module.vllm_available = lambda: False


def slow_save(module) -> None:
    seconds = float(os.environ[SLOW_SAVE_ENV])
    real = module._fsync_tree

    def paused(root):
        time.sleep(seconds)
        return real(root)

    module._fsync_tree = paused


def call_hooks(module) -> None:
    target, _, function = os.environ[HOOKS_ENV].partition(":")
    import importlib

    getattr(importlib.import_module(target), function)()


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Run ``patches[name](module)`` right after module ``name`` is executed."""

    def __init__(self, patches: dict) -> None:
        self.patches = patches

    def find_spec(self, name, path, target=None):
        if name not in self.patches:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        real_exec, patch = spec.loader.exec_module, self.patches[name]

        def exec_module(module):
            real_exec(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Apply the hooks the environment asks for: now to modules already imported (a forked child
    of the fork server calls this again after it sets its environment), else at their import."""
    patches = {}
    if os.environ.get(HF_ENGINE_ENV) == "1":
        patches["rlvr.rollout.builder"] = no_vllm
    if os.environ.get(SLOW_SAVE_ENV):
        patches["rlvr.checkpoint.full"] = slow_save
    if os.environ.get(HOOKS_ENV):
        patches["rlvr.training.trainer"] = call_hooks
    later = {}
    for name, patch in patches.items():
        if name in sys.modules:
            patch(sys.modules[name])
        else:
            later[name] = patch
    if later:
        sys.meta_path.insert(0, _PatchAfterImport(later))


install()
