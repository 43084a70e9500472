#!/bin/bash
# Round 12 (issue 12 item 5), one device call: the write-path GPU tests (test_gpu_api, test_layout, test_gpu -k
# TESTS_K), then bench/gpu_write12.py (bytes of every source, then timings next to the copy kernel) with the
# sources in SOURCES (--source NAME=DIR ...), then with NCU=1 Nsight Compute (sources NCU_SOURCES, default
# SOURCES) on one launch per (source, dtype, layout): instructions, issue, pipes, stall reasons, DRAM and store
# sectors per request. Writes under $OUT.
# Usage (repository root; wbase = a folder holding a previous kv_encode.cu and kv_common.cuh, e.g. from
# `git show 44f01dd:gpu_ref/kv_encode.cu`): SOURCES="--source old=wbase" NCU=1 bash bench/gpu_r12_device.sh
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv > $OUT/gpu.txt
t0=$(date +%s)
if [ "${TESTS_K:-}" != "none" ]; then
  timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -n ${WORKERS:-12} -p no:cacheprovider -rA tests/test_gpu_api.py \
    tests/test_layout.py tests/test_gpu.py -k "${TESTS_K:-encode or vpair or key_front or policy or paged or layout or api}" \
    > $OUT/pytest.log 2>&1
  echo "pytest rc $?: $(( $(date +%s) - t0 )) s"
  grep -E "passed|failed|^FAILED|^E  " $OUT/pytest.log | head -20
fi
timeout ${BENCH_TIMEOUT:-240} python3 bench/gpu_write12.py --out $OUT $SOURCES > $OUT/write12.log 2>&1
echo "bench rc $?: $(( $(date +%s) - t0 )) s"
grep -E "^\||^check|checks all|copy bandwidth|Error|error" $OUT/write12.log | cut -c1-150 | head -60
if [ -n "${NCU:-}" ]; then
  timeout ${NCU_TIMEOUT:-180} ncu --clock-control none -k regex:kv_encode --section SpeedOfLight \
    --section ComputeWorkloadAnalysis --section InstructionStats --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis_Tables --section Occupancy --section LaunchStats --metrics \
"smsp__inst_executed.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum,l1tex__t_requests_pipe_lsu_mem_global_op_st.sum,\
dram__bytes_read.sum,dram__bytes_write.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,\
regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active" \
    python3 bench/gpu_write12.py --ncu ${NCU_SOURCES:-$SOURCES} > $OUT/ncu.txt 2>&1
  echo "ncu rc $?: $(( $(date +%s) - t0 )) s"
  grep -E "ncu launch|  kv_encode|Duration|DRAM Throughput|Executed Ipc A|Issue Slots Busy|inst_executed.sum|sectors_pipe|requests_pipe|pipe_alu|pipe_fma |stalled_(math|wait|short|long|barrier|no_inst|mio|lg_th)" \
    $OUT/ncu.txt | cut -c1-120 | head -150
fi
echo "total: $(( $(date +%s) - t0 )) s"
