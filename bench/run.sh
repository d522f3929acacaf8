#!/usr/bin/env bash
# Runs Vela's seed benchmarks (bench/bench.py) and, beside them, the same
# scenarios on Apache Pulsar; prints one table per scenario, then the
# combined table with ratios, startup and memory, and issue 5's targets.
#
#   bench/run.sh                      every scenario, Vela and Pulsar, 1 and 3 bookies;
#                                     a full run rewrites bench/RESULTS.md
#   bench/run.sh sync-1k e2e-10k      just these scenarios
#   bench/run.sh --no-pulsar          Vela only (no Java needed)
#   bench/run.sh sync-1k --with-pmem --no-pulsar
#                                     also Vela with the pmem journal backend, its
#                                     region on tmpfs (emulated: memcpy + msync, not
#                                     persistent memory), beside the O_DIRECT journal
#   bench/run.sh --long               120 s runs (20 s warm-up) instead of 15 s (5 s)
#   BENCH_DURATION=30 BENCH_WARMUP=5 bench/run.sh ...
#   bench/run.sh offload-catch-up     catch-up reads from offloaded ledgers (S3 on
#                                     SeaweedFS) vs from the bookie, Vela alone
#                                     (bench/offload.py)
#   bench/run.sh --help               every flag of bench.py
#   bench/run.sh txn-produce          transactions of 10 x 1 KiB, commit each, and plain
#                                     sends beside them (bench/txn.py; needs go: the client
#                                     is bench/txnperf, on the official Go client)
#   VELA_BIN=/path/to/vela bench/run.sh   use that binary instead of building one
#
# Builds vela (release) first and installs Pulsar from Maven Central on first
# use (bench/pulsar/install.sh). Results, logs and the plot go to
# target/bench-results/.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"

args=()
pulsar=1
update=1
prev=""
for arg in "$@"; do
    case "$arg" in
        --no-pulsar) pulsar=0; args+=(--systems vela) ;;
        # Vela alone (offloaded vs bookie reads): no Pulsar install.
        offload-catch-up) pulsar=0; args+=("$arg") ;;
        --no-results) update=0 ;;
        *) args+=("$arg") ;;
    esac
    # Vela alone needs no Java: skip the Pulsar install when --systems
    # leaves Pulsar out.
    case "$arg" in
        --systems=*) [[ "${arg#--systems=}" == *pulsar* ]] || pulsar=0 ;;
    esac
    if [ "$prev" = "--systems" ] && [[ "$arg" != *pulsar* ]]; then
        pulsar=0
    fi
    prev="$arg"
done
if [ "$update" = 1 ]; then args+=(--update-results); fi

command -v python3 >/dev/null || { echo "error: bench/run.sh needs python3" >&2; exit 1; }
if [ -n "${VELA_BIN:-}" ]; then
    # A vela binary built elsewhere (e.g. from a clean checkout).
    [ -x "$VELA_BIN" ] || { echo "error: VELA_BIN=$VELA_BIN is not an executable" >&2; exit 1; }
    args+=(--vela "$VELA_BIN")
else
    if [ -z "${PROTOC:-}" ]; then
        if command -v protoc >/dev/null; then
            export PROTOC="$(command -v protoc)"
        else
            echo "error: building vela needs protoc (apt-get install protobuf-compiler)" >&2
            exit 1
        fi
    fi
    echo "building vela (cargo build --release -p vela)..."
    (cd "$root" && cargo build --release -p vela --quiet)
fi
if [ "$pulsar" = 1 ]; then
    "$here/pulsar/install.sh"
fi
exec python3 "$here/bench.py" "${args[@]}"
