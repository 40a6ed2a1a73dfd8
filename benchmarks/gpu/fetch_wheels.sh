#!/usr/bin/env bash
# Download, on a machine that reaches PyPI, the wheels the GPU image lacks for rlvr and for TRL's
# side of the benchmark (docs/gpu.md): Python 3.12, manylinux x86_64, no dependencies resolved
# (the image already holds torch, transformers, accelerate, numpy, pyarrow, pandas, xxhash, ...).
# They land in benchmarks/gpu/.wheels (git-ignored), which a device call carries; run.sh installs
# them there with `pip install --no-index --no-deps --target /tmp/rlvr-site` and puts that folder
# on PYTHONPATH (the image's site-packages untouched). About 20 MiB.
set -euo pipefail
cd "$(dirname "$0")"
DEST=${1:-.wheels}
mkdir -p "$DEST"
PY=${PYTHON:-python3}
# one version of each: two versions of one package stop the whole install
WHEELS=(
    # rlvr's own requirements missing from the image (pyproject.toml)
    "pydantic==2.14.4" "pydantic-core==2.50.5" "typing-extensions==4.16.0" "annotated-types==0.8.0" "typing-inspection==0.4.5"
    "math-verify==0.9.0" "latex2sympy2_extended==1.11.0" "antlr4-python3-runtime==4.13.2"
    "gguf==0.19.0"
    "datasets==5.2.0" "dill==0.4.1" "multiprocess==0.70.19"
    # installed only where the image's peft is older than rlvr's lower bound (run.sh checks)
    "peft==0.21.2"
    # the peer of the benchmark (never a dependency of rlvr)
    "trl==1.16.0"
)
PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    PLATFORMS+=(--platform "$p")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d "$DEST" "${WHEELS[@]}"
du -sh "$DEST"
ls "$DEST"
