#!/usr/bin/env bash
# Builds {{name}}.wasm, a WebAssembly component, next to this script, with
# componentize-js against wit/ (attest:plugin@0.2.0). Every WASI feature is
# disabled: the component imports only attest:plugin/*.
set -euo pipefail
cd "$(dirname "$0")"
[ -x node_modules/.bin/componentize-js ] || npm install --no-audit --no-fund --loglevel=error
npm test --silent
npm run --silent build
echo "built $(pwd)/{{name}}.wasm ($(stat -c %s {{name}}.wasm) bytes)"
