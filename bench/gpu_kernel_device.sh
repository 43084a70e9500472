#!/bin/bash
# One device call for the decode-kernel work (issue 12): GPU tests, then bench/gpu_bench.py --only kernel
# (the current kernel, a baseline source if BASELINE names a folder holding a previous kv_decode_attn.cu
# and kv_common.cuh, and the cluster merge, SDPA bf16 in the same run). Writes under $OUT.
# Usage (repository root): TESTS="-k 'not encode'" BASELINE=baseline bash bench/gpu_kernel_device.sh
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv | tee $OUT/gpu.txt
t0=$(date +%s)
eval timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -n ${WORKERS:-12} -p no:cacheprovider --durations=8 \
  tests/test_gpu_api.py tests/test_gpu.py ${TESTS:-} 2>&1 | tail -40 | tee $OUT/pytest.log
echo "tests: $(( $(date +%s) - t0 )) s" | tee -a $OUT/pytest.log
python3 bench/gpu_bench.py --only kernel --out $OUT ${BASELINE:+--baseline $BASELINE} 2>&1 | tee $OUT/gpu_bench_kernel.log
echo "total: $(( $(date +%s) - t0 )) s"
