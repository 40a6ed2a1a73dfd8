"""Which carried wheels the GPU call installs (run.sh; docs/gpu.md).

The wheels go into a folder that comes before the image's site-packages on PYTHONPATH, so a
carried wheel shadows the image's own version of the package. For most of them the image has
none. For a package the image does have and that other packages there were built against
(typing-extensions, peft), the carried wheel goes in only where the image's version is missing or
older than what rlvr or a carried wheel needs: shadowing a working newer one gains nothing and
can break what the image's own packages expect.

    python -m benchmarks.gpu.wheels benchmarks/gpu/.wheels    # prints the wheels to install
"""

from __future__ import annotations

import importlib.metadata as md
import sys
from collections.abc import Callable
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

# package -> the lowest version that serves: peft for rlvr's LoRA paths (pyproject.toml),
# typing-extensions for the carried pydantic-core (its Requires-Dist)
ONLY_IF_OLDER: dict[str, str] = {"peft": "0.18", "typing-extensions": "4.16.0"}


def installed_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def to_install(
    wheels: list[Path], installed: Callable[[str], str | None] = installed_version
) -> tuple[list[Path], list[str]]:
    """The wheels to install and, for each one left out, why (the image's version serves)."""
    chosen: list[Path] = []
    skipped: list[str] = []
    for wheel in sorted(wheels):
        name, version, *_ = parse_wheel_filename(wheel.name)
        floor = ONLY_IF_OLDER.get(canonicalize_name(name))
        have = installed(name) if floor is not None else None
        if have is not None and Version(have) >= Version(floor):
            skipped.append(f"{name} {version}: the image's {have} is at least {floor}")
        else:
            chosen.append(wheel)
    return chosen, skipped


def main(folder: str) -> None:
    chosen, skipped = to_install(list(Path(folder).glob("*.whl")))
    for line in skipped:
        print(f"[run.sh] not installed: {line}", file=sys.stderr)
    for wheel in chosen:
        print(wheel)


if __name__ == "__main__":
    main(sys.argv[1])
