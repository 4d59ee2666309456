#!/usr/bin/env bash
# Every GPU check in one go, for a CUDA machine with torch but no flash-attn wheel for it:
#   bash benchmarks/gpu_check.sh OUT_DIR [flash_attn-<version>.tar.gz]
# 1. builds flash-attn's bf16 forward kernels for head dims 32 (tiny) and 128 (Llama) from the
#    tarball (benchmarks/build_flash_attn.py), niced, while 2. gpu_check.py measures the PyTorch
#    backend alone; 3. gpu_check.py again with flash-attn (parity, step times, bench);
# 4. tests/engine_lite on CUDA, where the runner picks flash-attn by itself.
# Each stage has its own time limit and log in OUT_DIR, so one failure leaves the others' figures.
set -u
out=${1:?usage: gpu_check.sh OUT_DIR [flash_attn-VERSION.tar.gz]}
sdist=${2:-}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py=${PYTHON:-python3}
stamp() { echo "[$(date +%T)] $*" | tee -a "$out/stages.txt"; }

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  $py -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  nvcc --version | tail -1; nproc; } >"$out/machine.txt" 2>&1

if [ -n "$sdist" ]; then
  stamp "flash-attn build started"
  ( nice -n 15 timeout 360 $py benchmarks/build_flash_attn.py "$sdist" --out /tmp/flash_attn_build \
      --head-dims 32 128 >"$out/flash_build.log" 2>&1; echo "exit $?" >>"$out/flash_build.log" ) &
  build=$!
fi

stamp "torch backend: gpu_check.py"
timeout 300 $py benchmarks/gpu_check.py >"$out/torch_backend.jsonl" 2>"$out/torch_backend.err"
stamp "torch backend done: exit $?"

[ -z "$sdist" ] && exit 0
wait "$build"
stamp "flash-attn build: $(tail -1 "$out/flash_build.log")"
export PYTHONPATH="/tmp/flash_attn_build:$PYTHONPATH"
timeout 150 $py benchmarks/gpu_check.py >"$out/flash_backend.jsonl" 2>"$out/flash_backend.err"
stamp "flash backend done: exit $?"
timeout 180 $py -m pytest -p no:cacheprovider -m 'gpu or not gpu' -rs tests/engine_lite \
  >"$out/pytest.txt" 2>&1
stamp "gpu tests done: exit $?"
