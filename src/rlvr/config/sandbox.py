"""The `sandbox` section: where model-written code runs (the Python tool, the code reward;
docs/sandbox.md) and the limits each run gets unless its caller sets its own."""

from __future__ import annotations

from pydantic import Field, field_validator

from rlvr.config.base import Section

# strongest first; "auto" picks the first whose probe passes; unsafe_local only by name
SANDBOX_BACKENDS = ("auto", "bwrap", "landlock", "unsafe_local")


class SandboxConfig(Section):
    backend: str = Field(
        "auto",
        description="auto (the strongest that passes its probe: bwrap, then landlock), bwrap, "
        "landlock, unsafe_local (NO isolation: trusted code only, loudly warned), or "
        "'package.module:Factory' (your own backend, e.g. a remote service).",
    )
    concurrency: int = Field(
        0,
        ge=0,
        description="Sandboxed programs running at once in this process (0: the number of CPU "
        "cores); more calls wait their turn, and the wait is not counted against their limits.",
    )
    wall_s: float = Field(10.0, gt=0, description="Default wall-clock limit of one call.")
    cpu_s: float = Field(10.0, gt=0, description="Default CPU-time limit of one call.")
    memory_mb: int = Field(
        512, gt=0, description="Default memory limit of one call, over its whole process tree."
    )
    processes: int = Field(32, gt=0, description="Default limit on the processes of one call.")
    write_bytes: int = Field(
        16 * 2**20, gt=0, description="Default limit on the bytes written in the working folder."
    )
    files: int = Field(256, gt=0, description="Default limit on the files one call creates.")
    output_bytes: int = Field(
        64 * 2**10, gt=0, description="Default cut of stdout and stderr (each) of one call."
    )

    @field_validator("backend")
    @classmethod
    def _known(cls, value: str) -> str:
        if value in SANDBOX_BACKENDS or (":" in value and all(value.partition(":")[::2])):
            return value
        raise ValueError(
            f"sandbox.backend={value!r}: one of {', '.join(SANDBOX_BACKENDS)} or "
            "'package.module:Factory'"
        )
