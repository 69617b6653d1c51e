#!/usr/bin/env bash
# GPU end to end: the patched FlagScale 0.8.0 train_gpt.py trains a tiny GPT (configs/flagscale)
# on one GPU with torchrun, --mock-data, NullTokenizer, --transformer-impl local, no Transformer
# Engine or apex, MemScope on with the profiler and the allocator snapshot on rank 0. Checks
# the report, writes the small results (report JSON/Markdown/HTML, log tail, artifact list).
#
#   bash tools/gpu_e2e.sh prepare         # where PyPI is reachable: fills build/gpu_e2e/
#   bash tools/gpu_e2e.sh run OUTDIR      # on the GPU machine (no network needed)
#
# The GPU machine needs torch with CUDA, nvcc (Megatron's fused_kernels.load runs
# $CUDA_HOME/bin/nvcc -V), numpy, packaging, pyyaml, jinja2 and Python 3.12 (for the dataset
# helpers the wheel ships prebuilt; elsewhere make, g++ and pybind11 build them). megatron-core
# is not needed: FlagScale's bundled Megatron-LM is used. What `prepare` downloads (the
# FlagScale wheel, plotly for the HTML page) travels in build/gpu_e2e (ignored by git), e.g.
#   device run: command "bash tools/gpu_e2e.sh run $OUT", carry ["build/gpu_e2e"]
# then copy OUTDIR's files to examples/flagscale_gpu_e2e/.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PAYLOAD=${MEMSCOPE_E2E_PAYLOAD:-$REPO/build/gpu_e2e}
WORK=${MEMSCOPE_E2E_WORK:-/tmp/memscope_gpu_e2e}
PY=${PYTHON:-python3}
FS_VERSION=0.8.0
PLOTLY_VERSION=7.1.0

die() { echo "gpu_e2e: $*" >&2; exit 2; }

prepare() {
  mkdir -p "$PAYLOAD/wheels"
  local cached
  cached=$(ls "${MEMSCOPE_CACHE:-$HOME/.cache/memscope}/flag_scale-$FS_VERSION/"flag_scale-*.whl 2>/dev/null | head -n1 || true)
  if [[ -n "$cached" ]]; then
    cp "$cached" "$PAYLOAD/"
  else
    "$PY" -m pip download -q --no-deps "flag-scale==$FS_VERSION" -d "$PAYLOAD"
  fi
  "$PY" -m pip download -q --no-deps "plotly==$PLOTLY_VERSION" -d "$PAYLOAD/wheels"
  du -sh "$PAYLOAD"
}

setup_python() {
  "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
    || die "torch sees no CUDA device"
  if ! "$PY" -c 'import plotly' 2>/dev/null && compgen -G "$PAYLOAD/wheels/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" \
      "$PAYLOAD"/wheels/*.whl
  fi
  export PYTHONPATH="$REPO:$FS/third_party/Megatron-LM:$FS:$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
  local missing
  missing=$("$PY" - <<'EOF'
import importlib.util
need = ["numpy", "packaging", "yaml", "jinja2", "plotly", "einops", "regex"]
print(" ".join(n for n in need if importlib.util.find_spec(n) is None))
EOF
)
  [[ -z "$missing" ]] || die "missing Python packages: $missing (carry their wheels in $PAYLOAD/wheels)"
  if [[ -z "${CUDA_HOME:-}" ]]; then
    command -v nvcc >/dev/null || die "no nvcc: set CUDA_HOME (Megatron runs \$CUDA_HOME/bin/nvcc -V)"
    CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")")
    export CUDA_HOME
  fi
}

dataset_helpers() {
  # Megatron runs `make` in megatron/core/datasets at start-up. When the wheel's prebuilt
  # helpers match this Python, mark them up to date; otherwise make builds them (g++, pybind11).
  local dir="$FS/third_party/Megatron-LM/megatron/core/datasets" suffix
  suffix=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  if [[ -f "$dir/helpers_cpp$suffix" ]]; then
    touch "$dir/helpers_cpp$suffix"
  fi
  if ! command -v python3-config >/dev/null; then  # the Makefile asks it for the suffix
    mkdir -p "$WORK/bin"
    printf '#!/bin/sh\necho %s\n' "$suffix" >"$WORK/bin/python3-config"
    chmod +x "$WORK/bin/python3-config"
    export PATH="$WORK/bin:$PATH"
  fi
}

run() {
  local outdir=${1:?usage: gpu_e2e.sh run OUTDIR}
  mkdir -p "$outdir"
  outdir=$(cd "$outdir" && pwd)
  local wheel
  wheel=$(ls "$PAYLOAD"/flag_scale-$FS_VERSION-*.whl 2>/dev/null | head -n1) \
    || die "no FlagScale wheel in $PAYLOAD: run 'bash tools/gpu_e2e.sh prepare' first"
  rm -rf "$WORK/tree" "$WORK/memscope" "$WORK/ckpt"
  mkdir -p "$WORK/tree"
  "$PY" -m zipfile -e "$wheel" "$WORK/tree"
  FS="$WORK/tree/flag_scale"
  "$PY" "$REPO/tools/memscope_patch.py" apply --tree "$FS"
  setup_python
  dataset_helpers

  local args
  mapfile -t args < <("$PY" "$REPO/tools/flagscale_args.py" \
    --config "$REPO/configs/flagscale/memscope_tiny_gpt.yaml" --tree "$FS" \
    --set "train.system.memscope_outdir=$WORK/memscope" \
    --set "train.system.checkpoint.save=$WORK/ckpt")
  export TORCH_COMPILE_DISABLE=1 CUDA_DEVICE_MAX_CONNECTIONS=1 PYTHONUNBUFFERED=1
  export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
  set +e
  (
    cd "$FS"
    "$PY" -m torch.distributed.run --nproc_per_node 1 --master_port 29533 \
      flagscale/train/train_gpt.py "${args[@]}"
  ) 2>&1 | tee "$WORK/train.log"
  local rc=${PIPESTATUS[0]}
  set -e
  tail -n 200 "$WORK/train.log" >"$outdir/train_log_tail.txt"
  cp "$WORK/train.log" "$outdir/train_log.txt"  # whole: memscope analyze-log reads it
  [[ $rc -eq 0 ]] || die "training exited $rc (see $outdir/train_log_tail.txt)"

  local rank="$WORK/memscope/rank00000"
  "$PY" -m memscope.cli visualize-runtime --report "$rank/runtime_report.json" \
    --out "$rank/runtime_report.html"
  mkdir -p "$outdir/rank00000"
  cp "$rank"/runtime_report.{json,md,html} "$outdir/rank00000/"
  (cd "$WORK/memscope" && find . -type f -printf '%s\t%p\n' | sort -k2) >"$outdir/artifacts.txt"
  "$PY" - "$rank/runtime_report.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
arts = r["artifacts"]
problems = []
if r["status"] != "complete":
    problems.append(f"status {r['status']}: {r['status_reason']}")
if r["metadata"]["steps_completed"] != 6:
    problems.append(f"steps_completed {r['metadata']['steps_completed']} != 6")
if not any(k.startswith("profiler_trace") for k in arts):
    problems.append("no profiler trace")
if not any(k.startswith("memory_snapshot") for k in arts):
    problems.append("no allocator snapshot")
if r["errors"]:
    problems.append(f"errors: {r['errors']}")
print(f"peak {r['peak']['memory_bytes']} bytes at step {r['peak']['step']} "
      f"({r['peak']['phase']}, {r['peak']['module']}); artifacts: {sorted(arts)}")
sys.exit("gpu_e2e: " + "; ".join(problems) if problems else 0)
EOF
  echo "gpu_e2e: ok, results in $outdir"
}

case "${1:-}" in
  prepare) prepare ;;
  run) shift; run "$@" ;;
  *) die "usage: gpu_e2e.sh prepare | run OUTDIR" ;;
esac
