# GPU machine: source this to run binaries packed by scripts/gpu/pack_prebuilt.sh (carry
# ["build-bin", ".gpu/debs"]): it unpacks the staged runtime libraries (gloo, sentencepiece,
# toml++ ...; staged by ../shared/gpu/stage.sh), puts torch's, the CUDA libraries' and those on
# LD_LIBRARY_PATH, and unpacks build-bin/*.xz (and *.gz) into bin/.
#   source scripts/gpu/run_prebuilt.sh && bin/test_model_cuda --gtest_filter='GdrScanCuda.*'
prefix=/tmp/gpu-prefix
mkdir -p $prefix/.unpacked bin
for d in .gpu/debs/*.deb; do
  [ -f "$prefix/.unpacked/$(basename "$d")" ] || { dpkg -x "$d" $prefix && touch "$prefix/.unpacked/$(basename "$d")"; }
done
torch_lib=$(python3 -c "import torch, os; print(os.path.dirname(torch.__file__))")/lib
nv=$(cd "$torch_lib/../../nvidia" && pwd)
libs=$prefix/usr/lib/x86_64-linux-gnu:$torch_lib:$nv/cudnn/lib:$nv/cu13/lib:$nv/nccl/lib:$nv/nvshmem/lib
export LD_LIBRARY_PATH=$libs:$nv/cusparselt/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
# .gz first, so that an .xz of the same name (the newer packing) wins; a failed unpack removes its
# binary and says so.
for f in build-bin/*.gz build-bin/*.xz; do
  [ -f "$f" ] || continue
  n=bin/$(basename "${f%.*}")
  case "$f" in
    *.xz) xz -dc "$f" > "$n" 2>/dev/null ||
            python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' "$f" > "$n" ;;
    *) gunzip -c "$f" > "$n" ;;
  esac || { echo "run_prebuilt.sh: could not unpack $f" >&2; rm -f "$n"; continue; }
  chmod +x "$n"
done
