#!/usr/bin/env bash
# The GPU session's one call (docs/gpu.md). Prepare here: bash benchmarks/gpu/fetch_wheels.sh.
# On the device machine, from the repository root, carrying benchmarks/gpu/.wheels:
#     bash benchmarks/gpu/run.sh            (STAGE=tests or STAGE=bench runs one part)
# 1. what is installed (torch, transformers, peft, ... and the card), 2. the carried wheels
# (peft only where the image's is older than rlvr's lower bound), 3. rlvr itself (editable, no
# dependencies, no build isolation: there is no network), 4. the `-m gpu` tests, 5. the benchmark
# against TRL. Everything lands under $OUT (at most 8 files come back): env.txt, gpu-tests.log,
# bench.log, gpu-DATE.{json,md}, worker-logs.tgz. About 5 minutes on one H100.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/rlvr-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PY=${PYTHON:-python3}
WHEELS=benchmarks/gpu/.wheels
STAGE=${STAGE:-all}
start=$(date +%s)
stamp() { echo "[run.sh] $(( $(date +%s) - start ))s: $*"; }

{
    stamp "what is installed"
    "$PY" - <<'EOF'
import importlib.metadata as md
import sys

import torch

print("python", sys.version.split()[0], sys.executable)
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).total_memory)
for name in ("transformers", "peft", "accelerate", "trl", "datasets", "pydantic", "math-verify",
             "gguf", "safetensors", "tokenizers", "pyarrow", "typing_extensions", "huggingface-hub",
             "pytest", "rlvr"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "MISSING")
EOF
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv || true

    stamp "carried wheels"
    if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
        old_peft=$("$PY" -c "
import importlib.metadata as md
from packaging.version import Version
try:
    print(int(Version(md.version('peft')) < Version('0.18')))
except md.PackageNotFoundError:
    print(1)")
        wheels=()
        for w in "$WHEELS"/*.whl; do
            case "$(basename "$w")" in
                peft-*) [ "$old_peft" = 1 ] && wheels+=("$w") ;;
                *) wheels+=("$w") ;;
            esac
        done
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "${wheels[@]}"
    else
        echo "no wheels in $WHEELS (run benchmarks/gpu/fetch_wheels.sh here and carry the folder)"
    fi
    stamp "rlvr (editable, no dependencies)"
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
    "$PY" -c "import rlvr.training.trainer, peft, transformers, torch; print('rlvr imports; peft', peft.__version__)" || exit 1
} 2>&1 | tee "$OUT/env.txt"

if [ "$STAGE" = all ] || [ "$STAGE" = tests ]; then
    stamp "the -m gpu tests" | tee "$OUT/gpu-tests.log"
    timeout 200 "$PY" -m pytest -q -p no:randomly -m gpu -rA tests/gpu 2>&1 | tee -a "$OUT/gpu-tests.log"
fi
if [ "$STAGE" = all ] || [ "$STAGE" = bench ]; then
    stamp "the benchmark against TRL" | tee "$OUT/bench.log"
    export TMPDIR=${TMPDIR:-/tmp}
    # BENCH_ARGS: more options, e.g. "--sides rlvr,trl,rlvr-padded --shapes qwen2.5-1.5b"
    timeout 330 "$PY" -m benchmarks.gpu.bench --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tee -a "$OUT/bench.log"
    (cd "$TMPDIR/rlvr-gpu-bench" && find . -name '*.log' -o -name '*-result.json' |
        tar czf "$OUT/worker-logs.tgz" -T -) || true
fi
stamp "done"
