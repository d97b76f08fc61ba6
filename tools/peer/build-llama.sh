#!/bin/sh
# build-llama.sh: builds llama.cpp's CPU tools, kvlab's outside reference for GGUF models.
#
# llama.cpp's source comes from the PyPI source distribution of llama-cpp-python (which
# vendors it); nothing of it is kept in the repository. The script downloads the sdist with
# pip (or reuses one already there), extracts vendor/llama.cpp into a work folder, builds
# the tools the peer data needs with cmake, offline, and compiles tools/peer/dump_logits.c
# against the static libllama. It writes VERSION (llama.cpp's commit and ggml's version)
# beside the build.
set -eu

PKG_VERSION=0.3.36
WORK=${KVLAB_PEER:-$HOME/.cache/kvlab/peer}
JOBS=2
NATIVE=ON
HERE=$(cd "$(dirname "$0")" && pwd)

usage() {
    cat <<USAGE
usage: tools/peer/build-llama.sh [--work DIR] [--sdist FILE] [--jobs N] [--portable]

Builds llama.cpp (from llama-cpp-python==$PKG_VERSION's sdist) into a work folder:
  DIR/llama.cpp/          the extracted source
  DIR/build/bin/          llama-tokenize, llama-completion, llama-perplexity, llama-bench,
                          dump_logits (tools/peer/dump_logits.c)
  DIR/VERSION             llama.cpp's commit, ggml's version, the sdist's SHA-256

  --work DIR    work folder (default \${KVLAB_PEER:-\$HOME/.cache/kvlab/peer} = $WORK)
  --sdist FILE  use this llama_cpp_python-$PKG_VERSION.tar.gz instead of downloading it
                (pip download llama-cpp-python==$PKG_VERSION --no-deps --no-binary :all:)
  --jobs N      parallel build jobs (default $JOBS)
  --portable    build without -march=native (GGML_NATIVE=OFF)
  --help        this text
USAGE
}

SDIST=
while [ $# -gt 0 ]; do
    case $1 in
    --work) WORK=$2; shift 2 ;;
    --sdist) SDIST=$2; shift 2 ;;
    --jobs) JOBS=$2; shift 2 ;;
    --portable) NATIVE=OFF; shift ;;
    --help|-h) usage; exit 0 ;;
    *) echo "build-llama.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done

mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
TARBALL=$WORK/llama_cpp_python-$PKG_VERSION.tar.gz

# 1. The sdist: given, already downloaded, or fetched by pip.
if [ -n "$SDIST" ]; then
    [ -f "$SDIST" ] || { echo "build-llama.sh: no file $SDIST" >&2; exit 1; }
    [ -f "$TARBALL" ] || cp "$SDIST" "$TARBALL"
elif [ ! -f "$TARBALL" ]; then
    echo "== downloading llama-cpp-python==$PKG_VERSION (sdist)"
    python3 -m pip download "llama-cpp-python==$PKG_VERSION" --no-deps --no-binary :all: \
        -d "$WORK"
fi
[ -f "$TARBALL" ] || { echo "build-llama.sh: pip left no $TARBALL" >&2; exit 1; }
SHA=$(sha256sum "$TARBALL" | cut -d' ' -f1)

# 2. Extract only llama.cpp (and the changelog that names its commit).
SRC=$WORK/llama.cpp
if [ ! -f "$SRC/CMakeLists.txt" ]; then
    echo "== extracting vendor/llama.cpp"
    rm -rf "$WORK/extract"
    mkdir -p "$WORK/extract"
    tar -xzf "$TARBALL" -C "$WORK/extract" \
        "llama_cpp_python-$PKG_VERSION/vendor/llama.cpp" \
        "llama_cpp_python-$PKG_VERSION/CHANGELOG.md"
    mv "$WORK/extract/llama_cpp_python-$PKG_VERSION/vendor/llama.cpp" "$SRC"
    mv "$WORK/extract/llama_cpp_python-$PKG_VERSION/CHANGELOG.md" "$WORK/CHANGELOG.md"
    rm -rf "$WORK/extract"
fi

# 3. The version. The sdist has no .git, so cmake's build number would be 0 and its commit
# "unknown"; llama-cpp-python's changelog names the llama.cpp commit of each release.
COMMIT=$(sed -n "/^## \[$PKG_VERSION\]/,/^## \[/p" "$WORK/CHANGELOG.md" |
    sed -n 's/.*llama\.cpp@\([0-9a-f]\{7,40\}\).*/\1/p' | head -n 1)
[ -n "$COMMIT" ] || COMMIT=unknown
GGML_V=$(sed -n 's/^set(GGML_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\))/\2/p' \
    "$SRC/ggml/CMakeLists.txt" | paste -sd. -)

# 4. Configure and build the tools, offline: no curl/openssl, no server, tests or examples.
BUILD=$WORK/build
echo "== configuring llama.cpp $COMMIT (ggml $GGML_V) in $BUILD"
cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=$NATIVE -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_NUMBER=0 -DLLAMA_BUILD_COMMIT="$COMMIT" >"$WORK/configure.log"
cmake --build "$BUILD" -j "$JOBS" --target llama llama-tokenize llama-completion \
    llama-perplexity llama-bench

# 5. dump_logits: a small program of kvlab's own against the static libraries.
LIBS="$BUILD/src/libllama.a $BUILD/ggml/src/libggml.a $BUILD/ggml/src/libggml-cpu.a"
LIBS="$LIBS $BUILD/ggml/src/libggml-base.a"
echo "== compiling dump_logits"
cc -O2 -std=c11 -Wall -Wextra -I"$SRC/include" -I"$SRC/ggml/include" "$HERE/dump_logits.c" $LIBS \
    -lstdc++ -fopenmp -lm -lpthread -o "$BUILD/bin/dump_logits"

cat >"$WORK/VERSION" <<VER
llama.cpp commit $COMMIT (from llama-cpp-python $PKG_VERSION's CHANGELOG.md)
ggml $GGML_V
sdist llama_cpp_python-$PKG_VERSION.tar.gz sha256 $SHA
GGML_NATIVE=$NATIVE $(cc --version | head -n 1)
VER
echo "== done: $BUILD/bin"
cat "$WORK/VERSION"
