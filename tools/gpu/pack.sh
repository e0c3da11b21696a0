#!/bin/bash
# tools/gpu/pack.sh: run HERE (a Debian machine with the CUDA toolkit), from the repository
# root, before a GPU machine runs tools/gpu/check.sh. Fills .gpu-carry/ (git-ignored; it
# travels with the working tree) with what the GPU machine lacks:
#
#   include/, lib/   libdeflate's and zlib's headers and shared libraries (the machine has
#                    no Debian packages; the build links them) and NCCL's header (in case
#                    the machine's CUDA has none and its Python wheel neither)
#   data/            Fashion-MNIST (/usr/share/datasets/fashion-mnist) and the fortunes
#                    text (/usr/share/games/fortunes)
#   peer/            the PyTorch peer scripts (../shared/bench/peer)
#   prebuilt/        the plugin (sm_90), the programs and the GPU tests, built here with
#                    CUDA_ARCH=90 and stripped: check.sh builds on the machine first
#                    (the issue's check: it must build there) and falls back to these when
#                    that build fails, so the runs still happen
#
# Why both: a build there exercises the toolchain there but depends on headers and
# libraries found at run time (cuBLAS and NCCL live in Python wheels there); the prebuilt
# set needs only the shared libraries, which check.sh finds either way. Keeps the whole
# folder under 45 MiB (the working tree travels in 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
carry=$root/.gpu-carry
peer=${PEER:-$root/../shared/bench/peer}
fmnist=${FMNIST:-/usr/share/datasets/fashion-mnist}
fortunes=${FORTUNES:-/usr/share/games/fortunes}
cuda=${CUDA_HOME:-/usr/local/cuda}

rm -rf "$carry"
mkdir -p "$carry"/{include,lib,data/fashion-mnist,data/fortunes,peer,prebuilt/bin,prebuilt/lib,prebuilt/tests}

echo "== headers and libraries"
cp /usr/include/libdeflate.h /usr/include/zlib.h /usr/include/zconf.h "$carry/include/"
[ -f "$cuda/include/nccl.h" ] && cp "$cuda/include/nccl.h" "$carry/include/"
for lib in libdeflate.so.0 libz.so.1; do
    src=$(readlink -f "/usr/lib/x86_64-linux-gnu/$lib" 2>/dev/null || readlink -f "/lib/x86_64-linux-gnu/$lib")
    cp "$src" "$carry/lib/$lib"
    ln -sf "$lib" "$carry/lib/${lib%.*}" # libdeflate.so, libz.so: what -l finds
done

echo "== data"
cp "$fmnist"/*-ubyte.gz "$carry/data/fashion-mnist/"
find "$fortunes" -maxdepth 1 -type f ! -name '*.*' -exec cp {} "$carry/data/fortunes/" \;
cp "$peer/ddp_convnet.py" "$peer/gpt_bytes.py" "$carry/peer/"

echo "== prebuilt for sm_90 (a copy of the tree,)"
tmp=$(mktemp -d /tmp/dtrain-pack.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
git ls-files -z | xargs -0 cp --parents -t "$tmp"
git ls-files -z --others --exclude-standard | xargs -0 -r cp --parents -t "$tmp"
(cd "$tmp" && make -j"${JOBS:-2}" NODEPS=1 CUDA=1 CUDA_ARCH=90 MPI=0 lib programs gpu-tests) \
    > "$carry/prebuilt/build.log" 2>&1 || { tail -30 "$carry/prebuilt/build.log"; exit 1; }
for p in dtrain-mnist dtrain-gpt dtrain-resnet; do
    strip -o "$carry/prebuilt/bin/$p" "$tmp/build/bin/$p"
done
strip -g -o "$carry/prebuilt/lib/libdtrain_cuda.so" "$tmp/build/release/lib/libdtrain_cuda.so"
for t in "$tmp"/build/release/tests/gpu/test_*; do
    [ -x "$t" ] && strip -o "$carry/prebuilt/tests/$(basename "$t")" "$t"
done
git rev-parse HEAD > "$carry/prebuilt/commit"
git status --porcelain >> "$carry/prebuilt/commit"

size=$(du -sm "$carry" | cut -f1)
echo "== .gpu-carry: ${size} MiB"
du -sh "$carry"/* | sed 's/^/   /'
if [ "$size" -gt 45 ]; then
    echo "pack.sh: .gpu-carry is ${size} MiB, over the 45 MiB this script allows" >&2
    exit 1
fi
