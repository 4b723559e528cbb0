#!/usr/bin/env bash
# wkg (wasm-pkg-tools, the WebAssembly ecosystem's registry client) against
# ragen-host push/pull, both ways, on a throwaway local registry. Not part
# of CI: `cargo install wkg` is a 6-7 minute release build on 2 cores.
#
#   scripts/oci-interop-wkg.sh [path/to/wkg]
#
# Needs: target/debug/ragen-host (or $RAGEN_HOST), target/plugins/*.wasm
# (make plugins), /usr/bin/docker-registry (apt-get install docker-registry),
# and wkg (`cargo install wkg --locked --root target/wkg` when not given).
set -euo pipefail
cd "$(dirname "$0")/.."
WKG="${1:-target/wkg/bin/wkg}"
HOST="${RAGEN_HOST:-${CARGO_TARGET_DIR:-target}/debug/ragen-host}"
if [ ! -x "$WKG" ]; then
  echo "== cargo install wkg (once; about 7 minutes)"
  cargo install wkg --locked --root target/wkg
  WKG=target/wkg/bin/wkg
fi
"$WKG" --version

work=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat > "$work/config.yml" <<YML
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $work/storage
http:
  addr: 127.0.0.1:$port
YML
/usr/bin/docker-registry serve "$work/config.yml" 2> "$work/registry.log" &
registry=$!
trap 'kill $registry 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
export RAGEN_OCI_CACHE="$work/cache"
# wkg reaches a registry over plain HTTP when named in --insecure.
wkg_() { "$WKG" oci "$1" --insecure "127.0.0.1:$port" "${@:2}"; }

echo "== ragen-host push, wkg oci pull"
ref="127.0.0.1:$port/ragen/sokoban:0.2"
"$HOST" push target/plugins/sokoban.wasm "$ref" --plain-http
wkg_ pull "$ref" -o "$work/by-wkg.wasm"
cmp target/plugins/sokoban.wasm "$work/by-wkg.wasm"
echo "same bytes: $(sha256sum < "$work/by-wkg.wasm" | cut -c1-16)…"

echo "== wkg oci push, ragen-host pull and inspect"
theirs="127.0.0.1:$port/wkg/frozenlake:1"
wkg_ push "$theirs" target/plugins/frozenlake.wasm
"$HOST" pull "$theirs" -o "$work/by-ragen.wasm" --plain-http
cmp target/plugins/frozenlake.wasm "$work/by-ragen.wasm"
"$HOST" inspect "oci://$theirs" --plain-http | head -3
echo "wkg interoperates both ways"
