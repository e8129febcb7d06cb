#!/usr/bin/env bash
# Builds the json-output-keys assertion plugin into a WebAssembly component:
#   ../dist/json-output-keys.wasm   (i.e. plugins/dist/ at the repo root)
#
# Usage: ./build.sh [VENV_DIR]
#   VENV_DIR   virtualenv to create/reuse for componentize-py (default: .venv here)
# Environment:
#   PYTHON=python3   interpreter used to create the venv
#   STUB_WASI=1      pass --stub-wasi: every WASI import is replaced by a trapping
#                    stub, so the component imports only attest:plugin/* (see README)
#
# The WIT bindings (wit_world, componentize_py_types) are generated inside
# componentize-py at build time; nothing generated is written to this directory.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
venv=${1:-$here/.venv}
out_dir=$repo/plugins/dist
out=$out_dir/json-output-keys.wasm

if [ ! -x "$venv/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$venv"
fi
"$venv/bin/pip" install --disable-pip-version-check -q -r "$here/requirements.txt"
echo "componentize-py $("$venv/bin/componentize-py" --version | awk '{print $2}')"

# Stage only the plugin package, so the component holds nothing else from this
# directory (tests, venv) and no directory listing of any site-packages:
# componentize-py appends $VIRTUAL_ENV/site-packages (or, failing that, the
# interpreter's) to the Python path, so point it at an empty one.
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/src/json_output_keys" "$stage/empty-env/lib/python3/site-packages"
cp "$here"/json_output_keys/*.py "$stage/src/json_output_keys/"

extra=()
if [ "${STUB_WASI:-0}" = 1 ]; then
  extra+=(--stub-wasi)
fi

mkdir -p "$out_dir"
start=$(date +%s)
(
  cd "$stage/src"
  VIRTUAL_ENV="$stage/empty-env" "$venv/bin/componentize-py" \
    -d "$repo/wit/since_v0.1.0" -w assertion-plugin \
    componentize json_output_keys.app -p . ${extra[@]+"${extra[@]}"} -o "$out"
)
echo "built $out ($(stat -c %s "$out") bytes) in $(( $(date +%s) - start )) s"
