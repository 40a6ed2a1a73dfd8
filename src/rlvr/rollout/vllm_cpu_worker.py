"""vLLM's CPU worker, its shared memory named after its own job (``worker_cls`` under torchrun).

vLLM's CPU communicator joins the ranks of a tensor-parallel group through shared memory named
``<VLLM_DIST_IDENT>-<group>-<ranks>-cpushm``, and its CPU worker sets ``VLLM_DIST_IDENT`` from
the distributed init method (``vllm/v1/worker/cpu_worker.py``, ``CPUWorker.init_device``: the
file name of a ``file://`` method, else the part after its last colon). Under torchrun
(``external_launcher``, `rlvr.rollout.vllm_colocate`) that method is ``env://`` for every job
(``ExecutorWithExternalLauncher._distributed_args``), so two jobs on one machine asked for the
same names and the second failed with "create shm in SHMManager failed. errno: 17" (EEXIST).

This worker gives vLLM a ``file://`` method named by ``SHM_IDENT_ENV`` (a token rank 0 drew and
every rank of the job received, `vllm_colocate.job_token`) instead. The process group exists
already under torchrun, so vLLM reads the method for that name only: it opens no file and starts
no store with it. Importing this module imports vLLM: vLLM imports it by name, from
``worker_cls``.
"""

from __future__ import annotations

import os

from vllm.v1.worker.cpu_worker import CPUWorker

SHM_IDENT_ENV = "RLVR_VLLM_SHM_IDENT"


def init_method_for(ident: str) -> str:
    """The init method whose name vLLM's CPU worker takes as ``VLLM_DIST_IDENT``: ``ident``."""
    return f"file:///{ident}"


class JobScopedCPUWorker(CPUWorker):
    def init_device(self) -> None:
        ident = os.environ.get(SHM_IDENT_ENV)
        if ident and self.distributed_init_method == "env://":
            self.distributed_init_method = init_method_for(ident)
        super().init_device()
