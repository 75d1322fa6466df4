#!/bin/bash
# The lent GPU's one prepared call (bench/NOTES.md, "How to run it when a GPU is lent"):
# the card's state, gpu_check (preflight, figures, the CUDA tests), then two fresh
# processes' first generation (the second loads its kernels from the disk cache).
# Device run: carry [".gpu", ".whl"] (SmolLM2's config and tokenizer files; numpy 2.4's
# wheel: the image's numpy 2.5 fails numba-cuda 0.30.4; pytest-xdist's and execnet's, for
# the tests in 8 processes), kind "nvidia-h200", timeout ~560 s.
export PYTHONUNBUFFERED=1
# a C++ std::terminate ("terminate called without an active exception", seen once at a
# process's exit) aborts: faulthandler then prints every thread's Python stack
export PYTHONFAULTHANDLER=1
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
fi
OUT=${OUT:-/tmp/gpu-run}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,memory.used \
  --format=csv 2>&1 | tee "$OUT/smi.txt"
timeout "${GPU_CHECK_S:-420}" python3 bench/gpu_check.py --shape-only .gpu \
  --test-timeout "${TEST_S:-220}" > "$OUT/gpu_check.log" 2>&1
echo "gpu_check exit status: $?" >> "$OUT/gpu_check.log"
for run in 1 2; do
  timeout 35 python3 bench/gpu_first_step.py > "$OUT/first_step_$run.log" 2>&1
  echo "first step $run exit status: $?" >> "$OUT/first_step_$run.log"
  grep -v "^  File\|^    " "$OUT/first_step_$run.log" | tail -4
done
# the reply carries the end of the output: the table and the tests' summary
grep -E "^preflight|^\| |^device|^the step model|exit status|passed|failed|error|stopped after|terminate|Fatal" "$OUT/gpu_check.log" \
  | tail -90
