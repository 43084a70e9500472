#!/bin/bash
# Round 11 (issue 12), one device call: the GPU tests (test_gpu_api, test_gpu, test_hf) and the q~ parts
# measurement (bench/gpu_qparts.py, accuracy only) side by side, then the timings alone (bench/gpu_tune12.py:
# 8 vs 12 warps at equal split counts, v3 with one and two q~ parts, SDPA bf16). Writes under $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv | tee $OUT/gpu.txt
t0=$(date +%s)
timeout ${TEST_TIMEOUT:-330} python3 -m pytest -q -n ${WORKERS:-12} -p no:cacheprovider --durations=8 \
  tests/test_gpu_api.py tests/test_gpu.py tests/test_hf.py > $OUT/pytest_full.log 2>&1 &
tp=$!
timeout 300 python3 bench/gpu_qparts.py --out $OUT 2>&1 | tee $OUT/gpu_qparts.log
echo "qparts: $(( $(date +%s) - t0 )) s"
wait $tp; echo "pytest rc $?" >> $OUT/pytest_full.log
tail -30 $OUT/pytest_full.log
echo "tests: $(( $(date +%s) - t0 )) s"
timeout 200 python3 bench/gpu_tune12.py --out $OUT 2>&1 | tee $OUT/gpu_tune12.log
echo "total: $(( $(date +%s) - t0 )) s"
