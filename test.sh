#!/usr/bin/env bash
# The one test command: README shows it, .ci/run calls it.
#   ./test.sh          fast suite (what CI runs; must stay under 25 minutes on 2 cores)
#   ./test.sh --full   adds the slow suites (more crash rounds, more seeds, longer soaks)
# It installs what the tests need on a fresh machine (Debian packages, pip packages).
set -euo pipefail
cd "$(dirname "$0")"

FULL=0
for arg in "$@"; do
  case "$arg" in
    --full) FULL=1 ;;
    *) echo "test.sh: unknown argument '$arg' (expected --full)" >&2; exit 2 ;;
  esac
done
export VELA_TEST_FULL=$FULL

step() { printf '\n=== %s ===\n' "$*"; }

# --- what the tests need -------------------------------------------------------
need_apt=()
command -v protoc >/dev/null 2>&1 || need_apt+=(protobuf-compiler)
command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server)
# Client certificates of the auth tests: `openssl x509 -req` (version 1 certificates).
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
# The pulsar dev-dependency links the system OpenSSL (native-tls).
pkg-config --exists openssl 2>/dev/null || need_apt+=(pkg-config libssl-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  step "installing Debian packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
# The pulsar dev-dependency (the official Rust client) runs protoc from its
# build script; Vela itself builds with a vendored protoc.
export PROTOC="${PROTOC:-$(command -v protoc)}"

# Python packages of the official-client suite are installed by tests/python.sh.

# --- checks ---------------------------------------------------------------------
step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings

step "cargo test (workspace)"
# One output file per run (under target/, kept for reading after a failure):
# concurrent runs, e.g. in several worktrees, never overwrite each other's.
mkdir -p target
cargo_out=$(mktemp target/cargo-test.XXXXXX.out)
set +e
cargo test --workspace --quiet >"$cargo_out" 2>&1
rc=$?
set -e
grep -E '^(test result|running [0-9]+ tests? in|---- )' "$cargo_out" || true
if [ $rc -ne 0 ]; then
  tail -n 80 "$cargo_out" >&2
  echo "cargo test failed (exit $rc); full output in $cargo_out" >&2
  exit 1
fi

# Root suites (real processes, official clients) are added under tests/ by their issues.
for suite in tests/*.sh; do
  [ -e "$suite" ] || continue
  step "suite $suite"
  bash "$suite"
done

total=$(grep -E '^test result:' "$cargo_out" | awk '{p+=$4; f+=$6} END {print p" passed, "f" failed"}')
rm -f "$cargo_out"
echo
echo "$total"
