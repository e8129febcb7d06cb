#!/usr/bin/env bash
# Builds the JavaScript assertion plugins into WebAssembly components with
# componentize-js (pinned in package.json / package-lock.json):
#   plugins/js/readability/src/readability.js  ->  plugins/dist/readability.wasm
#
# Every WASI feature componentize-js would link (stdio, random, clocks, http,
# fetch-event) is disabled, so the component imports only attest:plugin/*:
# the engine grants plugins nothing else anyway, and a component importing
# wasi:http would not load. What that means inside the plugin (a frozen
# Date.now(), a fixed Math.random(), no timers) is in docs/plugins.md.
#
# Usage: plugins/js/build.sh        (needs node >= 18 and npm)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$here"

if ! command -v npm >/dev/null; then
  echo "error: npm is missing; install Node.js 18 or newer (apt-get install -y nodejs npm)" >&2
  exit 1
fi
if [ ! -x node_modules/.bin/componentize-js ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi
npm test --silent

mkdir -p "$repo/plugins/dist"
for plugin in readability; do
  start=$(date +%s)
  node_modules/.bin/componentize-js "$plugin/src/$plugin.js" \
    --wit "$repo/wit/since_v0.2.0" -n assertion-plugin \
    --disable stdio random clocks http fetch-event \
    -o "$repo/plugins/dist/$plugin.wasm"
  printf 'dist/%-20s %10d bytes in %ds\n' "$plugin.wasm" "$(stat -c %s "$repo/plugins/dist/$plugin.wasm")" "$(( $(date +%s) - start ))"
done
