#!/bin/bash
# One device call for kernel work (issues 10, 12): the GPU tests (TESTS: extra pytest arguments,
# TEST_TIMEOUT seconds; they also fill CuPy's kernel cache in parallel), then bench/gpu_bench.py --only ONLY
# (default kernel: the current decode kernel, the sources BASELINE names -- old=DIR for the round-7 kernel,
# NAME=DIR for others -- and the cluster merge, SDPA bf16 in the same run; ONLY=write: the write kernel, BASELINE=DIR
# a previous kv_encode.cu/encode.py). Writes under $OUT. Usage (repository root):
#   BASELINE=old=baseline TESTS="-k 'not encode'" bash bench/gpu_kernel_device.sh
#   ONLY=write BASELINE=base TESTS="-k 'encode or key or policy or paged'" bash bench/gpu_kernel_device.sh
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv | tee $OUT/gpu.txt
t0=$(date +%s)
eval timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -n ${WORKERS:-12} -p no:cacheprovider --durations=8 \
  tests/test_gpu_api.py tests/test_gpu.py ${TESTS:-} 2>&1 | tail -40 | tee $OUT/pytest.log
echo "tests: $(( $(date +%s) - t0 )) s" | tee -a $OUT/pytest.log
python3 bench/gpu_bench.py --only ${ONLY:-kernel} --out $OUT ${BASELINE:+--baseline $BASELINE} 2>&1 | tee $OUT/gpu_bench_${ONLY:-kernel}.log
echo "total: $(( $(date +%s) - t0 )) s"
