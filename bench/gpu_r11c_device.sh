#!/bin/bash
# Round 11 (issue 12), third device call: the GPU tests (test_gpu_api, test_gpu, test_hf) on the final tree
# (two q~ parts kept for key scales, the LONG_TUNE planner rule); the full pytest output under $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv | tee $OUT/gpu.txt
t0=$(date +%s)
timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -n ${WORKERS:-12} -p no:cacheprovider --durations=8 -rfs -s \
  tests/test_gpu_api.py tests/test_gpu.py tests/test_hf.py > $OUT/pytest_full.log 2>&1
echo "pytest rc $?"
grep -E "passed|failed|^FAILED|^E  " $OUT/pytest_full.log | head -30
grep -E "key scales e_max|-QS-" $OUT/pytest_full.log | head -30
echo "total: $(( $(date +%s) - t0 )) s"
