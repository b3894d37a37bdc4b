#!/bin/bash
# GPU machine: the delta rule's kernels in one call. Builds deltadeck and the model's GPU tests,
# runs the delta-rule tests (their summary lines, and each failure with its message), then
# bench gdr at bench gdr's shape (every row) and at hybrid base's head (the default and the bf16
# reverse scan). Run with carry [".gpu"] (scripts/gpu/build_target.sh):
#   bash scripts/gpu/gdr_check.sh [gtest filter]
set -uo pipefail
filter=${1:-'GdrScanCuda.*:GdrChunkFrontCuda.*:ModelCuda.ChunkedGdr*:GdrStateGradsCuda.*:TrilSolve*'}
t0=$(date +%s)
bash scripts/gpu/build_target.sh deltadeck test_model_cuda || exit 1
echo "built in $(( $(date +%s) - t0 )) s"
export LD_LIBRARY_PATH=/tmp/gpu-prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
build-gpu/tests/model/test_model_cuda --gtest_filter="$filter" > /tmp/gdr_tests.log 2>&1
grep -E '^\[(gdr|gdr_scan|gdr_chunk)[^]]*\] .*(worst|bf16)|PASSED|FAILED  \]' /tmp/gdr_tests.log | grep -v "^\[gdr_scan\] docs" | head -60
grep -B1 -A4 'Failure' /tmp/gdr_tests.log | cut -c1-300 | head -60
echo "tests done at $(( $(date +%s) - t0 )) s"
build-gpu/app/deltadeck bench gdr --repeats 20 2>&1 | tail -22
build-gpu/app/deltadeck bench gdr --repeats 20 --heads 6 --head-dim 96 --value-dim 192 2>&1 | grep -E 'chunk core|default|bf16 rev'
echo "all done at $(( $(date +%s) - t0 )) s"
