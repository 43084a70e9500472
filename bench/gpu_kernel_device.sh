#!/bin/bash
# One device call for kernel work (issues 10, 12): the GPU tests (TESTS: extra pytest arguments, "none" skips
# them; TEST_TIMEOUT seconds; they also fill CuPy's kernel cache in parallel), then bench/gpu_bench.py --only ONLY.
# ONLY=kernel (default): the current decode kernel, the sources BASELINE names -- old=DIR for the round-7 kernel,
# NAME=DIR for others, planned with the tune BASELINE_TUNE (JSON) --, the current kernel with each tune of TUNES
# (JSON list), the cluster merge, SDPA bf16 in the same run; NO_WRITE=1 skips the write-kernel rows, NO_DECODE=1
# the decode rows (write rows alone, incl. the vpair value layout). ONLY=write:
# the write kernel, BASELINE=DIR a previous kv_encode.cu/encode.py. Then with PAGING=1 --only paging (paged vs
# contiguous, issue 10), then with NCU=1 Nsight Compute on the headline decode launch (default plan and the tunes
# of NCU_TUNES: instructions, issue slots, DRAM, warp stall reasons). Writes under $OUT. Usage (repository root):
#   BASELINE=main=baseline BASELINE_TUNE='{"qlo": 1}' TUNES='[{"qlo": 1}]' PAGING=1 NCU=1 \
#     TESTS="-k 'not encode'" bash bench/gpu_kernel_device.sh
#   ONLY=write BASELINE=base TESTS="-k 'encode or key or policy or paged'" bash bench/gpu_kernel_device.sh
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv | tee $OUT/gpu.txt
t0=$(date +%s)
if [ "${TESTS:-}" != "none" ]; then
  eval timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -n ${WORKERS:-12} -p no:cacheprovider --durations=8 \
    tests/test_gpu_api.py tests/test_gpu.py ${TESTS:-} 2>&1 | tail -40 | tee $OUT/pytest.log
  echo "tests: $(( $(date +%s) - t0 )) s" | tee -a $OUT/pytest.log
fi
ONLY=${ONLY:-kernel}
if [ "$ONLY" = kernel ]; then
  python3 bench/gpu_bench.py --only kernel --out $OUT ${BASELINE:+--baseline $BASELINE} \
    ${BASELINE_TUNE:+--baseline-tune "$BASELINE_TUNE"} ${TUNES:+--tunes "$TUNES"} ${NO_WRITE:+--no-write} \
    ${NO_DECODE:+--no-decode} 2>&1 | tee $OUT/gpu_bench_kernel.log
else
  python3 bench/gpu_bench.py --only $ONLY --out $OUT ${BASELINE:+--baseline $BASELINE} 2>&1 | tee $OUT/gpu_bench_$ONLY.log
fi
echo "$ONLY bench: $(( $(date +%s) - t0 )) s"
if [ -n "${PAGING:-}" ]; then
  python3 bench/gpu_bench.py --only paging --out $OUT 2>&1 | tee $OUT/gpu_bench_paging.log
  echo "paging bench: $(( $(date +%s) - t0 )) s"
fi
if [ -n "${NCU:-}" ]; then
  NCU_TUNES=${NCU_TUNES:-[]} timeout ${NCU_TIMEOUT:-150} ncu --clock-control none -k regex:kv_decode_attn \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    --section SchedulerStats --metrics "smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,\
regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    python3 bench/gpu_bench.py --ncu-decode > $OUT/gpu_bench_ncu.txt 2>&1
  echo "ncu rc $?: $(( $(date +%s) - t0 )) s"
  grep -E "kv_decode_attn<|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|inst_executed|issue_active|stalled|No Eligible|Issued Warp|Warp Cycles" \
    $OUT/gpu_bench_ncu.txt | cut -c1-160 | head -90
fi
echo "total: $(( $(date +%s) - t0 )) s"
