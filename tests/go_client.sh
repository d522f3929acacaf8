#!/usr/bin/env bash
# The official Go client (github.com/apache/pulsar-client-go, fetched by the
# go tool from the Go module proxy into target/go: nothing installed
# globally) against a fresh `vela standalone` with advertised listeners:
# non-persistent topics, a pattern consumer finding new topics, topic
# termination, lookups by listener name, transactions (commit visible on two
# topics at once, aborted sends never visible, acks undone by an abort, a
# timeout aborts, the admin views) (tests/go-client).
# Called by ./test.sh; needs go (skipped with a note when absent).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

if ! command -v go >/dev/null 2>&1; then
  echo "go not found: the Go client suite is skipped"
  exit 0
fi
export PROTOC="${PROTOC:-$(command -v protoc)}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
export GOPATH="$TARGET/go" GOMODCACHE="$TARGET/go/mod" GOCACHE="$TARGET/go/cache"
cargo build -q -p vela
VELA="$TARGET/debug/vela"

PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
DATA="$(mktemp -d -t vela-go-client-XXXXXX)"
OUT="$DATA.out"
"$VELA" standalone --data-dir "$DATA" --port "$PORT" --http-port 0 \
  --advertised-listeners "internal:pulsar://127.0.0.1:$PORT,external:pulsar://localhost:$PORT" \
  --transaction-coordinator-enabled \
  >"$OUT" 2>"$DATA.log" &
PID=$!
cleanup() {
  kill -TERM "$PID" 2>/dev/null || true
  wait "$PID" 2>/dev/null || true
  rm -rf "$DATA" "$OUT" "$DATA.log"
}
trap cleanup EXIT

for _ in $(seq 1 600); do
  grep -q 'ready' "$OUT" 2>/dev/null && break
  kill -0 "$PID" 2>/dev/null || { cat "$DATA.log" >&2; echo "vela standalone exited" >&2; exit 1; }
  sleep 0.1
done
export VELA_PULSAR_URL="$(grep -o 'pulsar://[0-9.]*:[0-9]*' "$OUT" | head -n1)"
export VELA_HTTP_URL="$(grep -o 'http://[0-9.]*:[0-9]*' "$OUT" | head -n1)"
export VELA_LISTEN_PORT="$PORT"
[ -n "$VELA_PULSAR_URL" ] && [ -n "$VELA_HTTP_URL" ] || { cat "$OUT" "$DATA.log" >&2; exit 1; }

cd tests/go-client
if go test -count=1 -v -timeout 300s ./... >"$DATA.go.log" 2>&1; then
  grep -E '^(--- |ok|FAIL)' "$DATA.go.log" || true
  echo "$(grep -c '^--- PASS' "$DATA.go.log") passed, 0 failed"
else
  cat "$DATA.go.log" >&2
  tail -n 40 "$DATA.log" >&2
  echo "Go client suite failed" >&2
  exit 1
fi
