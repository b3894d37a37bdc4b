#!/bin/bash
# GPU machine: build the deltadeck binary of an older commit for a before/after comparison in the
# same call. Locally: git worktree add .before <commit> (and list /.before/ in .git/info/exclude);
# then carry [".gpu", ".before"] and run: bash scripts/gpu/build_before.sh  -> build-before/app/deltadeck
set -euo pipefail
prefix=/tmp/gpu-prefix
if [ ! -d $prefix ]; then mkdir -p $prefix; for d in .gpu/debs/*.deb; do dpkg -x "$d" $prefix; done; fi
torch_cmake=$(python3 -c "import torch; print(torch.utils.cmake_prefix_path)")
nccl_root=$(python3 -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])" 2>/dev/null || true)
export CMAKE_PREFIX_PATH="$torch_cmake:$prefix/usr:$prefix/usr/lib/x86_64-linux-gnu/cmake"
export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
export CPATH="$prefix/usr/include${nccl_root:+:$nccl_root/include}:${CPATH:-}"
cmake -S .before -B build-before -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DDELTADECK_GUI=OFF > build-before.configure.log 2>&1 || { tail -30 build-before.configure.log; exit 1; }
cmake --build build-before -j 16 --target deltadeck > build-before.build.log 2>&1 || { grep -E -A6 "error|FAILED" build-before.build.log | head -40; exit 1; }
echo "built: build-before/app/deltadeck"
