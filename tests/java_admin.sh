#!/usr/bin/env bash
# The official Java admin client (org.apache.pulsar:pulsar-client-admin, from
# Maven Central at build time; nothing committed) against a fresh
# `vela standalone --bookies 2 --ensemble-size 1`: tenants, namespaces and their
# policies, a partitioned topic whose namespace persistence is raised to 2/2/2
# (the next ledger must be on two bookies), stats after a produce, subscriptions.
# Called by ./test.sh; needs java and mvn (the first run downloads the jars).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

export PROTOC="${PROTOC:-$(command -v protoc)}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
cargo build -q -p vela
VELA="$TARGET/debug/vela"

echo "building tests/java-admin (mvn)"
(cd tests/java-admin && mvn -B -q package dependency:build-classpath \
  -Dmdep.outputFile=target/cp.txt >/tmp/vela-java-admin-mvn.log 2>&1) || {
  tail -n 40 /tmp/vela-java-admin-mvn.log >&2
  echo "mvn build failed (full log: /tmp/vela-java-admin-mvn.log)" >&2
  exit 1
}

DATA="$(mktemp -d -t vela-java-admin-XXXXXX)"
OUT="$DATA.out"
"$VELA" standalone --data-dir "$DATA" --port 0 --http-port 0 --bookies 2 --ensemble-size 1 \
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
PULSAR_URL="$(grep -o 'pulsar://[0-9.]*:[0-9]*' "$OUT" | head -n1)"
HTTP_URL="$(grep -o 'http://[0-9.]*:[0-9]*' "$OUT" | head -n1)"
[ -n "$PULSAR_URL" ] && [ -n "$HTTP_URL" ] || { cat "$OUT" "$DATA.log" >&2; exit 1; }

CP="tests/java-admin/target/classes:$(cat tests/java-admin/target/cp.txt)"
passed=0
for check in vela.AdminCheck vela.ClientCheck; do
  if java -cp "$CP" "$check" "$HTTP_URL" "$PULSAR_URL"; then
    passed=$((passed + 1))
  else
    tail -n 40 "$DATA.log" >&2
    echo "$passed passed, 1 failed ($check)"
    exit 1
  fi
done
echo "$passed passed, 0 failed"
