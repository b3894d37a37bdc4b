#!/bin/bash
# GPU machine: build CMake targets, much faster than ../shared/gpu's build.sh (which builds
# everything). Run with carry [".gpu"], staged by `GPU_DEBS="libgloo-dev libgloo0" bash ../shared/gpu/stage.sh`
# (trainer/comm.cpp includes c10d's Gloo header, which needs gloo's own headers):
#   bash scripts/gpu/build_target.sh deltadeck                 # this tree -> build-gpu/
#   SRC=.before BUILD=build-before bash scripts/gpu/build_target.sh deltadeck
# The second form builds an older commit for a before/after comparison in the same call: locally
# `git worktree add .before <commit>` (.before/ is ignored) and carry [".gpu", ".before"].
# CMAKE_EXTRA adds configure arguments, e.g. CMAKE_EXTRA=-DCMAKE_CUDA_FLAGS=-DNAME for a variant.
set -euo pipefail
targets=("${@:?usage: build_target.sh TARGET...}")
src=${SRC:-.}
build=${BUILD:-build-gpu}
prefix=/tmp/gpu-prefix
# Unpack each staged package once (one staged later, on a warm machine, is unpacked then).
mkdir -p $prefix/.unpacked
for d in .gpu/debs/*.deb; do
  [ -f "$prefix/.unpacked/$(basename "$d")" ] || { dpkg -x "$d" $prefix && touch "$prefix/.unpacked/$(basename "$d")"; }
done
# cuDNN's frontend headers (model/cudnn_attention.cpp) from its wheel, staged once with
#   .venv/bin/pip download nvidia-cudnn-frontend==1.32.0 --no-deps --only-binary=:all: --python-version 3.12 -d .gpu
# (the machine reaches no registry; only the wheel's include/ is used). Without it packed rows keep flash.
frontend_args=()
whl=$(ls .gpu/nvidia_cudnn_frontend-*.whl 2>/dev/null | head -1 || true)
if [ -n "$whl" ]; then
  if [ ! -f $prefix/cudnn-frontend/include/cudnn_frontend.h ]; then
    python3 -c "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); \
z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith('include/')])" "$whl" $prefix/cudnn-frontend
  fi
  frontend_args=(-DDD_CUDNN_FRONTEND_INCLUDE_DIR=$prefix/cudnn-frontend/include)
fi
torch_cmake=$(python3 -c "import torch; print(torch.utils.cmake_prefix_path)")
nccl_root=$(python3 -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])" 2>/dev/null || true)
export CMAKE_PREFIX_PATH="$torch_cmake:$prefix/usr:$prefix/usr/lib/x86_64-linux-gnu/cmake"
export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
export CPATH="$prefix/usr/include${nccl_root:+:$nccl_root/include}:${CPATH:-}"
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DDELTADECK_GUI=OFF \
  "${frontend_args[@]}" ${CMAKE_EXTRA:-} > "$build.configure.log" 2>&1 || { tail -30 "$build.configure.log"; exit 1; }
cmake --build "$build" -j 16 --target "${targets[@]}" > "$build.build.log" 2>&1 \
  || { grep -E -A6 "error|FAILED" "$build.build.log" | head -40; exit 1; }
echo "built ${targets[*]} in $build/"
