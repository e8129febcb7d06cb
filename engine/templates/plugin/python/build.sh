#!/usr/bin/env bash
# Builds {{name}}.wasm, a WebAssembly component, next to this script, with
# componentize-py (in .venv here) against wit/ (attest:plugin@0.2.0).
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
fi
.venv/bin/pip install --disable-pip-version-check -q -r requirements.txt
.venv/bin/python -m pytest -q tests
# Only the package goes into the component: stage it, and point componentize-py
# at an empty environment so no site-packages are bundled.
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/src/{{module}}" "$stage/env/lib/python3/site-packages"
cp {{module}}/*.py "$stage/src/{{module}}/"
project="$(pwd)"
out="$project/{{name}}.wasm"
(cd "$stage/src" && VIRTUAL_ENV="$stage/env" "$project/.venv/bin/componentize-py" -d "$project/wit" -w assertion-plugin \
  componentize {{module}}.app -p . -o "$out")
echo "built $out ($(stat -c %s "$out") bytes)"
