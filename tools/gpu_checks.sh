#!/usr/bin/env bash
# Every check of the GPU list (../shared/gpu-checklist.md) in one pass on a machine with one GPU:
#   1. runtime correctness      tools/gpu_runtime_check.py
#   2. overhead, ~1B GPT bf16   tools/gpu_megatron_check.py --sections overhead
#      and per hook event       tools/bench_hook_cost.py --device cuda
#   3. accuracy, megatron-core  tools/gpu_megatron_check.py --sections accuracy (+ losses, 5.)
#   4. FlagScale end to end     tools/gpu_e2e.sh run
#   5. a real snapshot fixture  tools/gpu_megatron_check.py --sections fixture
# (6., analyze-log on the end-to-end run's own log, needs no GPU: it runs where the results
# land, on the returned train_log.txt.)
#
#   bash tools/gpu_checks.sh OUTDIR
#   MEMSCOPE_GPU_CHECKS="runtime_check megatron_losses" bash tools/gpu_checks.sh OUTDIR  # some
#
# Offline GPU machine: what it lacks travels as wheels in .whl/ (megatron-core 0.16.1 and
# plotly for its Python) and build/gpu_e2e/ (the FlagScale 0.8.0 wheel, from
# `bash tools/gpu_e2e.sh prepare`); they are installed into a private folder, nothing of the
# machine's own is replaced. Each check runs under its own time limit and a failing check does
# not stop the others. OUTDIR gets gpu_checks.log (everything printed), results.tar.gz (each check's
# output, JSON results and reports), e2e_memscope.tar.gz (the end-to-end run's MemScope folder)
# and the fixture's allocator snapshot.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUTDIR=$(mkdir -p "${1:?usage: gpu_checks.sh OUTDIR}" && cd "$1" && pwd)
WORK=${MEMSCOPE_GPU_WORK:-/tmp/memscope_gpu_checks}
PY=${PYTHON:-python3}
RESULTS="$WORK/results"
rm -rf "$WORK" && mkdir -p "$RESULTS"
exec > >(tee "$OUTDIR/gpu_checks.log") 2>&1
cd "$REPO"

echo "== machine $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" \
    .whl/*.whl || echo "wheel install failed"
fi
export PYTHONPATH="$REPO:$WORK/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$PY" -c 'import torch, megatron.core, plotly, sys; print("python", sys.version.split()[0],
"torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(),
"megatron-core", megatron.core.__version__, "plotly", plotly.__version__)' \
  | tee "$RESULTS/environment.txt"

# the whole pass ends by this deadline (MEMSCOPE_GPU_BUDGET seconds from here): each check's
# limit is cut to what is left, so the archive is always written
DEADLINE=$(($(date +%s) + ${MEMSCOPE_GPU_BUDGET:-450}))

check() {  # check NAME SECONDS CMD...: run CMD with a time limit, output in RESULTS/NAME.txt
  local name=$1 limit=$2 start rc
  shift 2
  if [[ -n "${MEMSCOPE_GPU_CHECKS:-}" && " $MEMSCOPE_GPU_CHECKS " != *" $name "* ]]; then
    echo "== $name: not asked for (MEMSCOPE_GPU_CHECKS)"
    return
  fi
  start=$(date +%s)
  if ((DEADLINE - start - 10 < limit)); then limit=$((DEADLINE - start - 10)); fi
  if ((limit < 20)); then
    echo "== $name: skipped, the pass's time is used up" | tee -a "$RESULTS/exit_codes.txt"
    return
  fi
  echo "== $name (limit ${limit} s)"
  timeout -k 10 "$limit" "$@" >"$RESULTS/$name.txt" 2>&1
  rc=$?
  grep -v -E "Warning|warnings.warn|^\s*$" "$RESULTS/$name.txt" | tail -n 40
  echo "== $name: exit $rc after $(($(date +%s) - start)) s" | tee -a "$RESULTS/exit_codes.txt"
}

check runtime_check 90 "$PY" tools/gpu_runtime_check.py --outdir "$WORK/runtime"
check megatron_accuracy 150 "$PY" tools/gpu_megatron_check.py --outdir "$WORK/megatron" \
  --sections accuracy fixture
check e2e 150 bash tools/gpu_e2e.sh run "$RESULTS/e2e"
check megatron_overhead 150 "$PY" tools/gpu_megatron_check.py --outdir "$WORK/overhead" \
  --sections profile overhead
check hook_cost 40 "$PY" tools/bench_hook_cost.py --device cuda
CUBLAS_WORKSPACE_CONFIG=:4096:8 check megatron_losses 60 "$PY" tools/gpu_megatron_check.py \
  --outdir "$WORK/losses" --sections losses

# the small outputs: JSON results, reports (no traces); the fixture snapshot on its own
for dir in runtime megatron losses overhead; do  # (not the profile section's reports)
  [[ -d "$WORK/$dir" ]] || continue
  (cd "$WORK" && find "$dir" -type f \( -name '*.json' -o -name '*.md' \) -size -6M -print0 \
    | xargs -0 -r cp --parents -t "$RESULTS")
done
find "$WORK/megatron/fixture" -name 'memory_snapshot*.pickle' -size -16M -exec cp -t "$OUTDIR" {} + \
  2>/dev/null
tar -czf "$OUTDIR/results.tar.gz" -C "$WORK" results
[[ -d /tmp/memscope_gpu_e2e/memscope ]] \
  && tar -czf "$OUTDIR/e2e_memscope.tar.gz" -C /tmp/memscope_gpu_e2e memscope
ls -la "$OUTDIR"
