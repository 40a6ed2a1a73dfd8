#!/usr/bin/env bash
# The GPU session's one call (docs/gpu.md). Prepare here: bash benchmarks/gpu/fetch_wheels.sh.
# On the device machine, from the repository root, carrying benchmarks/gpu/.wheels, with the
# call's timeout at 600 s:
#     bash benchmarks/gpu/run.sh
# Rehearsal on a CPU (the same stages, the dry bench, the GPU tests collected and skipped):
#     REHEARSE=1 OUT=/tmp/rehearsal PYTHON=.venv/bin/python bash benchmarks/gpu/run.sh
#
# Stages, most valuable first, each capped (caps in seconds; the whole call TOTAL_S=570):
#   1. env     (60)  what is installed, the carried wheels into $SITE (pip --target, never the
#                    image's site-packages; a package the image has in a serving version stays
#                    out: benchmarks/gpu/wheels.py), rlvr from src/ on PYTHONPATH; STOPS the call here
#                    when rlvr, torch, transformers or peft does not import
#   2. tests   (150) `pytest -m gpu tests/gpu` without the FSDP test, verbose, as it goes
#   3. bench   (150) the Qwen2.5-0.5B shape, rlvr then TRL; the tables written after each side
#   4. fsdp    (120) the FSDP2/NCCL/DCP test alone (its torchrun job capped below, at cap - 20)
#   5. chunks  (60)  log-probs a chunk at a time against the full path and TRL's loss path at
#                    2,048-token replies (benchmarks/studies/logprob_chunks.py --device cuda)
#   6. bench   (rest) the Qwen2.5-1.5B shape, appended to the same tables, by a deadline
#   7. summary       test counts, the budget line of every stage and the tables, printed LAST
#                    (the call's reply shows the output's last 12,000 characters)
# Files under $OUT (7 of the 8 that come back): run.log (everything), env.txt, gpu-tests.log,
# bench.log, gpu-DATE.json, gpu-DATE.md (gpu-DATE-rehearsal.* when rehearsing), worker-logs.tgz (the
# workers' logs and the log-probs study's JSON and table).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-/tmp/rlvr-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-benchmarks/gpu/.wheels}
SITE=${SITE:-${TMPDIR:-/tmp}/rlvr-site}
REHEARSE=${REHEARSE:-0}
TOTAL_S=${TOTAL_S:-570}
RESERVE_S=20 # kept for the summary at the end
# this call's own (a rerun on a warm machine must not meet an earlier call's run directories);
# its worker logs come back in worker-logs.tgz, then it goes
WORK=${TMPDIR:-/tmp}/rlvr-gpu-bench.$$
start=$(date +%s)
deadline=$((start + TOTAL_S))
if [ "$REHEARSE" = 1 ]; then
    STEM=gpu-$(date -u +%F)-rehearsal
    BENCH=(--dry --steps 2)
    SHAPE_A=tiny SHAPE_B=tiny-b SIDE_TIMEOUT=120
    CHUNKS=(--in-process --tokens 16,24 --rows 2 --chunk 8)
else
    STEM=gpu-$(date -u +%F)
    BENCH=()
    SHAPE_A=qwen2.5-0.5b SHAPE_B=qwen2.5-1.5b SIDE_TIMEOUT=75
    CHUNKS=(--device cuda --shape qwen2.5-0.5b --tokens 512,2048 --chunk 1024)
fi
BUDGET=${TMPDIR:-/tmp}/rlvr-gpu-budget.$$ # the stages' budget lines, printed again at the end
CHUNKS_MD=${TMPDIR:-/tmp}/rlvr-gpu-chunks.$$.md # the log-probs table, printed again at the end
: >"$BUDGET"

elapsed() { echo $(($(date +%s) - start)); }
left() { echo $((deadline - $(date +%s))); }
# cap WANT: WANT seconds, or what is left before the reserve when that is less (at least 1)
cap() {
    local c=$(($(left) - RESERVE_S))
    [ "$c" -gt "$1" ] && c=$1
    [ "$c" -lt 1 ] && c=1
    echo "$c"
}
stage() { # stage NAME CAP: the stage's budget line
    stage_name=$1 stage_cap=$2 stage_t0=$(date +%s)
    echo "[run.sh] ===== stage $1: starts at $(elapsed)s, cap ${2}s, $(left)s left of ${TOTAL_S}s"
}
stage_end() { # stage_end RC
    local line
    line="[run.sh] stage $stage_name: exit $1, $(($(date +%s) - stage_t0))s of cap ${stage_cap}s, done at $(elapsed)s"
    echo "$line"
    echo "$line" >>"$BUDGET"
}
capped() { # capped SECONDS CMD...: the command, killed at the cap (then KILL 10 s later)
    local s=$1
    shift
    timeout -k 10 "$s" "$@"
}

summary() {
    echo
    echo "[run.sh] ===== summary ($(elapsed)s)"
    for log in "$OUT/env.txt" "$OUT/gpu-tests.log"; do
        [ -f "$log" ] && grep -E "^\[run.sh\] (rlvr imports|STOP|TRL)|^(=+ )?[0-9]+ (passed|failed|skipped|error|deselected)|^=+ .*(passed|failed|skipped|error|no tests ran).* =+$|^(FAILED|ERROR) " "$log"
    done
    cat "$BUDGET"
    rm -f "$BUDGET"
    if [ -s "$CHUNKS_MD" ]; then
        echo
        cat "$CHUNKS_MD"
    fi
    rm -f "$CHUNKS_MD"
    if [ -f "$OUT/$STEM.md" ]; then
        echo
        cat "$OUT/$STEM.md"
    else
        echo "[run.sh] no benchmark tables ($OUT/$STEM.md was not written)"
    fi
    echo "[run.sh] files under \$OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
}

main() {
    local rc failed=0

    stage env "$(cap 60)"
    {
        capped "$(cap 30)" "$PY" - <<'EOF'
import importlib.metadata as md
import sys

import torch

print("python", sys.version.split()[0], sys.executable)
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).total_memory)
for name in ("transformers", "peft", "accelerate", "trl", "datasets", "pydantic", "math-verify",
             "gguf", "safetensors", "tokenizers", "pyarrow", "fsspec", "typing_extensions",
             "huggingface-hub", "pytest", "packaging", "rlvr"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "MISSING")
EOF
        command -v nvidia-smi >/dev/null &&
            nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
        if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
            # a wheel of a package the image has in a serving version stays out (wheels.py)
            mapfile -t wheels < <(capped "$(cap 20)" "$PY" -m benchmarks.gpu.wheels "$WHEELS")
            if [ "${#wheels[@]}" = 0 ]; then
                echo "[run.sh] benchmarks.gpu.wheels chose nothing (above): installing them all"
                wheels=("$WHEELS"/*.whl)
            fi
            echo "[run.sh] installing ${#wheels[@]} wheels into $SITE (pip --target)"
            rm -rf "$SITE"
            capped "$(cap 45)" "$PY" -m pip install -q --no-index --no-deps --no-compile \
                --no-cache-dir --target "$SITE" "${wheels[@]}" ||
                echo "[run.sh] the wheels did not install into $SITE (exit $?)"
        else
            echo "[run.sh] no wheels in $WHEELS (run benchmarks/gpu/fetch_wheels.sh and carry the folder)"
        fi
    } 2>&1 | tee "$OUT/env.txt"
    # rlvr from the checkout's src/, the carried wheels after it, the caller's PYTHONPATH last
    export PYTHONPATH="$ROOT:$ROOT/src:$SITE${PYTHONPATH:+:$PYTHONPATH}"
    echo "[run.sh] PYTHONPATH=$PYTHONPATH" | tee -a "$OUT/env.txt"
    capped "$(cap 30)" "$PY" -c "
import peft, torch, transformers
import rlvr, rlvr.training.trainer
assert rlvr.__file__.startswith('$ROOT/src/'), rlvr.__file__
print('[run.sh] rlvr imports from', rlvr.__file__, '; peft', peft.__version__,
      '; transformers', transformers.__version__, '; torch', torch.__version__)
" 2>&1 | tee -a "$OUT/env.txt"
    rc=${PIPESTATUS[0]}
    if [ "$rc" != 0 ]; then
        echo "[run.sh] STOP: rlvr does not import (exit $rc, above): nothing else can run" |
            tee -a "$OUT/env.txt"
        stage_end "$rc"
        return 1
    fi
    capped "$(cap 30)" "$PY" -c "
try:
    import datasets, trl
    print('[run.sh] TRL', trl.__version__, 'imports')
except Exception as exc:
    print('[run.sh] TRL does not import (its side is skipped):', repr(exc))
" 2>&1 | tee -a "$OUT/env.txt"
    stage_end 0

    stage tests "$(cap 150)"
    capped "$stage_cap" "$PY" -m pytest -v -rA --durations=15 -p no:randomly -p no:cacheprovider \
        -m gpu tests/gpu --ignore=tests/gpu/test_cuda_fsdp_dcp.py 2>&1 | tee "$OUT/gpu-tests.log"
    rc=${PIPESTATUS[0]}
    stage_end "$rc"
    [ "$rc" = 0 ] || failed=1

    stage "bench-$SHAPE_A" "$(cap 150)"
    # the sides end by the deadline; the process's own cap 15 s later (JSON and tables written)
    capped $((stage_cap + 15)) "$PY" -m benchmarks.gpu.bench "${BENCH[@]}" --out "$OUT" \
        --stem "$STEM" --work "$WORK" --shapes "$SHAPE_A" --timeout "$SIDE_TIMEOUT" \
        --deadline $(($(date +%s) + stage_cap)) ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
    rc=${PIPESTATUS[0]}
    stage_end "$rc"
    [ "$rc" = 0 ] || failed=1

    stage fsdp "$(cap 120)"
    RLVR_FSDP_TIMEOUT_S=$((stage_cap > 40 ? stage_cap - 20 : stage_cap / 2)) \
        capped "$stage_cap" "$PY" -m pytest -v -rA --durations=5 -p no:randomly \
        -p no:cacheprovider -m gpu tests/gpu/test_cuda_fsdp_dcp.py 2>&1 |
        tee -a "$OUT/gpu-tests.log"
    rc=${PIPESTATUS[0]}
    stage_end "$rc"
    [ "$rc" = 0 ] || failed=1

    stage chunks "$(cap 60)"
    # the log-probs without the full logits against the full path and TRL's loss path, 2,048-token
    # replies, Qwen's vocabulary: peaks by max_memory_allocated, the numbers compared
    capped "$stage_cap" "$PY" -m benchmarks.studies.logprob_chunks "${CHUNKS[@]}" \
        --out "$WORK/chunks" 2>&1 | tee -a "$OUT/bench.log"
    rc=${PIPESTATUS[0]}
    cat "$WORK"/chunks/*.md >"$CHUNKS_MD" 2>/dev/null
    stage_end "$rc"
    [ "$rc" = 0 ] || failed=1

    stage "bench-$SHAPE_B" "$(cap 600)"
    capped $((stage_cap + 15)) "$PY" -m benchmarks.gpu.bench "${BENCH[@]}" --out "$OUT" \
        --stem "$STEM" --work "$WORK" --shapes "$SHAPE_B" --timeout 240 --append \
        --deadline $(($(date +%s) + stage_cap)) ${BENCH_ARGS:-} 2>&1 | tee -a "$OUT/bench.log"
    rc=${PIPESTATUS[0]}
    stage_end "$rc"
    [ "$rc" = 0 ] || failed=1

    (cd "$WORK" 2>/dev/null && find . -name '*.log' -o -name '*-result.json' -o -path './chunks/*' |
        tar czf "$OUT/worker-logs.tgz" -T -) || true
    rm -rf "$WORK"
    return "$failed"
}

main 2>&1 | tee "$OUT/run.log"
rc=${PIPESTATUS[0]}
summary 2>&1 | tee -a "$OUT/run.log"
exit "$rc"
