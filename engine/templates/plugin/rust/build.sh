#!/usr/bin/env bash
# Builds {{name}}.wasm, a WebAssembly component, next to this script.
#  - With rustup's wasm32-wasip2 target installed: a plain cargo build.
#  - Otherwise, Debian's rustc-web recipe (apt-get install rustc-web cargo-web
#    rust-web-src): std is built for wasm32 with -Zbuild-std and rustup's
#    wasm-component-ld links the component. std is built once per target
#    directory; CARGO_TARGET_DIR (default ~/.cache/attest-plugins-target)
#    shares it between plugin projects.
set -euo pipefail
cd "$(dirname "$0")"

# Either way: wasm's 128-bit vectors, which the engine always supports (faster
# text search), and a 128 KiB stack instead of Rust's 1 MiB, since the engine
# resets a plugin's whole memory after each call (a smaller memory is a
# cheaper call; a stack that runs out traps).
# (Cargo ignores these target flags when RUSTFLAGS is set.)
wasm_flags="-C target-feature=+simd128 -C link-arg=-zstack-size=131072"

if command -v rustup >/dev/null && rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip2; then
  echo "building with rustup's wasm32-wasip2 target"
  target_dir="${CARGO_TARGET_DIR:-target}"
  CARGO_TARGET_WASM32_WASIP2_RUSTFLAGS="${CARGO_TARGET_WASM32_WASIP2_RUSTFLAGS:-} $wasm_flags" cargo build --release --target wasm32-wasip2
  cp "$target_dir/wasm32-wasip2/release/{{crate}}.wasm" {{name}}.wasm
else
  for f in /usr/bin/rustc /usr/bin/cargo /usr/lib/rustlib/src/rust/library/std; do
    if [ ! -e "$f" ]; then
      echo "error: $f is missing: run 'rustup target add wasm32-wasip2', or install Debian's toolchain: apt-get install -y rustc-web cargo-web rust-web-src" >&2
      exit 1
    fi
  done
  bin="$(rustc --print sysroot)/lib/rustlib/$(rustc -vV | sed -n 's/^host: //p')/bin"
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/attest-plugins-target}"
  echo "building with Debian's rustc-web and -Zbuild-std (no wasm32-wasip2 target in rustup) in $CARGO_TARGET_DIR"
  CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER="$bin/wasm-component-ld" \
  CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS="-C link-arg=--wasm-ld-path=$bin/gcc-ld/wasm-ld $wasm_flags" \
  RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 \
    /usr/bin/cargo build --release -Zbuild-std=std,panic_abort --target wasm32-unknown-unknown
  cp "$CARGO_TARGET_DIR/wasm32-unknown-unknown/release/{{crate}}.wasm" {{name}}.wasm
fi
echo "built $(pwd)/{{name}}.wasm ($(stat -c %s {{name}}.wasm) bytes)"
