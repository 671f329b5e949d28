#!/bin/sh
# Build gloo's own benchmark three ways from a gloo source tree you provide (docs/upstream/gloo-471.md):
#   OUT/stock/benchmark             the tree as it is
#   OUT/recv-first/benchmark        with gloo-471.patch (each step's recv posted before its send)
#   OUT/both-recvs-first/benchmark  with gloo-471-both-recvs.patch (both first receives before any send)
#
# usage: sh docs/upstream/build-gloo-benchmark.sh GLOO_SOURCE_TREE OUT_DIR
# needs: cmake, a C++ compiler, Debian's libhiredis-dev (apt-get install cmake libhiredis-dev); the benchmark
# needs USE_REDIS to build, but its ranks meet through --shared-path (a directory every host sees).
# One configure and one full build (a few minutes on 2 cores); each patch then recompiles gloo/allgather.cc
# only. The source tree is copied to OUT/src; the one you gave is not touched. Nothing is downloaded.
set -eu
if [ $# -ne 2 ] || [ ! -f "$1/gloo/allgather.cc" ]; then
    echo "usage: sh $0 GLOO_SOURCE_TREE OUT_DIR (a checkout of github.com/pytorch/gloo)" >&2
    exit 2
fi
src=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$2"
out=$(cd "$2" && pwd)
jobs=$(nproc 2>/dev/null || echo 2)

rm -rf "$out/src"
cp -a "$src" "$out/src"          # -a keeps the files' times: an earlier build in OUT/build stays valid,
touch "$out/src/gloo/allgather.cc"   # except the file the patches change (a patched object may be newer)
cmake -S "$out/src" -B "$out/build" -DBUILD_BENCHMARK=ON -DUSE_REDIS=ON -DCMAKE_BUILD_TYPE=Release >"$out/cmake.log"

build() {   # build() NAME: the benchmark of the tree as it is now, copied to OUT/NAME/benchmark
    make -C "$out/build" -j"$jobs" benchmark >"$out/make-$1.log"
    mkdir -p "$out/$1"
    cp "$out/build/gloo/benchmark/benchmark" "$out/$1/benchmark"
    echo "built $out/$1/benchmark"
}

build stock
for variant in recv-first:gloo-471.patch both-recvs-first:gloo-471-both-recvs.patch; do
    name=${variant%%:*}
    patch_file=$here/${variant#*:}
    patch -s -d "$out/src" -p1 <"$patch_file"
    build "$name"
    patch -s -R -d "$out/src" -p1 <"$patch_file"
done
