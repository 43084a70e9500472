#!/bin/bash
# Round 11 (issue 12), second device call: the planner rule for 12 warps (bench/gpu_tune12.py --rule, alone on the
# GPU, SDPA bf16 in the same run), then the GPU tests (test_gpu_api, test_gpu, test_hf) with one q~ part for key
# scales and the rule. Writes under $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv | tee $OUT/gpu.txt
t0=$(date +%s)
timeout ${RULE_TIMEOUT:-200} python3 bench/gpu_tune12.py --rule --out $OUT 2>&1 | tee $OUT/gpu_rule12.log
echo "rule: $(( $(date +%s) - t0 )) s"
timeout ${TEST_TIMEOUT:-250} python3 -m pytest -q -n ${WORKERS:-12} -p no:cacheprovider --durations=8 -rs \
  tests/test_gpu_api.py tests/test_gpu.py tests/test_hf.py 2>&1 | tail -45 | tee $OUT/pytest_full.log
grep -h "key scales e_max\|QS" $OUT/pytest_full.log | head -20
echo "total: $(( $(date +%s) - t0 )) s"
