#!/bin/bash
# Workstation: build CMake targets for the GPU machine here (Release, sm_90, no GUI, this
# checkout's .venv torch, which is the GPU machine's torch 2.11 + CUDA 13.0) and pack them,
# stripped and xz-compressed, into build-bin/ (ignored), to carry to the GPU machine with
# scripts/gpu/run_prebuilt.sh: a call then spends no time compiling (about a minute in all instead
# of four), and binaries of two commits can run side by side in one call.
#   bash scripts/gpu/pack_prebuilt.sh deltadeck test_model_cuda      # -> build-bin/*.xz
#   NAME=deltadeck.base bash scripts/gpu/pack_prebuilt.sh deltadeck  # packs it as deltadeck.base.xz
# The first build takes about 12 minutes on two cores; later ones rebuild what changed.
# Carry ["build-bin", ".gpu/debs"] (run_prebuilt.sh is tracked, so it travels anyway); keep build-bin
# and the tracked files under the 64 MiB carry limit (about 12 MiB a binary; gzip's 19 MiB left room
# for only two beside the tree).
set -euo pipefail
targets=("${@:?usage: pack_prebuilt.sh TARGET...}")
build=${BUILD:-build-sm90}
site=$(.venv/bin/python -c "import site; print(site.getsitepackages()[0])")
if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DDELTADECK_GUI=OFF \
    -DTorch_DIR="$site/torch/share/cmake/Torch" -DDD_CUDNN_FRONTEND_INCLUDE_DIR="$site/include" \
    > "$build.configure.log" 2>&1 || { tail -30 "$build.configure.log"; exit 1; }
fi
cmake --build "$build" -j 2 --target "${targets[@]}" > "$build.build.log" 2>&1 \
  || { grep -E -A6 "error|FAILED" "$build.build.log" | head -40; exit 1; }
mkdir -p build-bin
for t in "${targets[@]}"; do
  bin=$(find "$build" -type f -name "$t" -perm -u+x | head -1)
  [ -n "$bin" ] || { echo "no binary named $t under $build"; exit 1; }
  name=${NAME:-$t}
  strip -o "build-bin/$name" "$bin"
  rm -f "build-bin/$name.gz"
  xz -T2 -6 -f "build-bin/$name"
  echo "build-bin/$name.xz $(du -h "build-bin/$name.xz" | cut -f1)"
done
