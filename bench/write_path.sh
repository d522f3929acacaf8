#!/usr/bin/env bash
# Where a sync publish's time goes: starts a fresh `vela standalone`, runs the
# write_path example (one producer, sync sends) against it, prints each
# write-path stage's mean/p50, the stage sum and its ratio to the measured
# publish latency. A benchmark: prints figures, asserts nothing. Not part of
# ./test.sh (its figures need a quiet machine).
#   bench/write_path.sh [--release] [--bookies N] [--messages N] [--size BYTES]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

PROFILE=debug; CARGO_FLAGS=(); BOOKIES=2; MESSAGES=2000; SIZE=100
while [ $# -gt 0 ]; do
  case "$1" in
    --release) PROFILE=release; CARGO_FLAGS=(--release) ;;
    --bookies) BOOKIES="$2"; shift ;;
    --messages) MESSAGES="$2"; shift ;;
    --size) SIZE="$2"; shift ;;
    *) echo "write_path.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

export PROTOC="${PROTOC:-$(command -v protoc)}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
cargo build -q "${CARGO_FLAGS[@]}" -p vela --bin vela --example write_path
VELA="$TARGET/$PROFILE/vela"
EXAMPLE="$TARGET/$PROFILE/examples/write_path"

DATA="$(mktemp -d -t vela-write-path-XXXXXX)"
OUT="$DATA.out"
VELA_LOG=warn "$VELA" standalone --data-dir "$DATA" --port 0 --http-port 0 --bookies "$BOOKIES" \
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
  kill -0 "$PID" 2>/dev/null || { cat "$DATA.log" >&2; exit 1; }
  sleep 0.1
done
cat "$OUT"
PULSAR_URL="$(grep -o 'pulsar://[0-9.]*:[0-9]*' "$OUT" | head -n1)"
HTTP_URL="$(grep -o 'http://[0-9.]*:[0-9]*' "$OUT" | head -n1)"
echo "profile: $PROFILE, data dir on: $(df -T "$DATA" | awk 'NR==2 {print $2}')"
"$EXAMPLE" "$PULSAR_URL" "$HTTP_URL" "$MESSAGES" "$SIZE"
