#!/bin/bash
# GPU machine: build one CMake target of this tree into build-gpu/ (faster than build.sh, which
# builds everything). Usage, with carry [".gpu"]: bash scripts/gpu/build_target.sh deltadeck
set -euo pipefail
prefix=/tmp/gpu-prefix
if [ ! -d $prefix ]; then mkdir -p $prefix; for d in .gpu/debs/*.deb; do dpkg -x "$d" $prefix; done; fi
torch_cmake=$(python3 -c "import torch; print(torch.utils.cmake_prefix_path)")
nccl_root=$(python3 -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])" 2>/dev/null || true)
export CMAKE_PREFIX_PATH="$torch_cmake:$prefix/usr:$prefix/usr/lib/x86_64-linux-gnu/cmake"
export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
export CPATH="$prefix/usr/include${nccl_root:+:$nccl_root/include}:${CPATH:-}"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DDELTADECK_GUI=OFF > build-gpu.configure.log 2>&1 || { tail -30 build-gpu.configure.log; exit 1; }
cmake --build build-gpu -j 16 --target "$1" > build-gpu.build.log 2>&1 || { grep -E -A6 "error|FAILED" build-gpu.build.log | head -40; exit 1; }
echo "built $1"
