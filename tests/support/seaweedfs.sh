#!/usr/bin/env bash
# SeaweedFS, the real S3-compatible server the tiered-storage tests and the
# offload benchmark write to (github.com/seaweedfs/seaweedfs, a Go module the
# go tool fetches from the Go module proxy at test time; nothing of it is in
# git). Its `weed` binary is built once into a cache outside the work tree,
# $VELA_TOOLS_DIR/seaweedfs-$VERSION (default ~/.cache/vela-tools), so fresh
# clones on the same machine (CI's) reuse it; the Go module and build caches
# of the build are removed once the binary is there (only it is kept).
#
#   tests/support/seaweedfs.sh build        builds if needed; prints the binary's path
#   tests/support/seaweedfs.sh serve DIR    runs `weed server -s3` on 127.0.0.1 with
#                                           its data in DIR (the ports chosen on the
#                                           first start are kept in DIR/ports, so a
#                                           restart serves the same endpoint), with
#                                           one identity (the access key below) and
#                                           the bucket $BUCKET; prints
#                                           "ready s3 http://127.0.0.1:PORT bucket B"
#                                           once the bucket takes requests, then
#                                           waits for weed (TERM stops it; its log
#                                           is DIR/weed.log).
#
# The identity the tests sign with: AWS_ACCESS_KEY_ID=vela-test-key,
# AWS_SECRET_ACCESS_KEY=vela-test-secret (a loopback-only test server).
set -euo pipefail
VERSION="v0.0.0-20261109003541-7506e5f91cd6"
MODULE="github.com/seaweedfs/seaweedfs"
BUCKET="${SEAWEEDFS_BUCKET:-vela-offload}"
ACCESS_KEY="vela-test-key"
SECRET_KEY="vela-test-secret"
STARTUP_TIMEOUT_S=120

TOOLS_DIR="${VELA_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/vela-tools}"
TOOLS="$TOOLS_DIR/seaweedfs-$VERSION"
WEED="$TOOLS/weed"

die() { echo "seaweedfs.sh: $*" >&2; exit 1; }

build() {
  if [ -x "$WEED" ]; then echo "$WEED"; return; fi
  command -v go >/dev/null 2>&1 || die "go not found: building SeaweedFS needs the go tool (1.26 or later)"
  mkdir -p "$TOOLS"
  # One build at a time (test binaries may ask at once).
  exec 9>"$TOOLS.lock"
  flock 9
  if [ -x "$WEED" ]; then echo "$WEED"; return; fi
  local gopath="$TOOLS/go" work="$TOOLS/build"
  export GOPATH="$gopath" GOMODCACHE="$gopath/mod" GOCACHE="$gopath/cache"
  export CGO_ENABLED=0 GOFLAGS=-mod=mod
  local started=$SECONDS
  echo "seaweedfs.sh: building weed $VERSION (once; cached in $TOOLS)" >&2
  # (Each step says `|| exit 1`: `set -e` does not hold in a subshell
  # followed by `||`.) SeaweedFS's go.mod has replace directives, which `go install pkg@version`
  # refuses: build it from a throwaway module that requires it and repeats
  # those directives (they hold only for the main module).
  rm -rf "$work"
  mkdir -p "$work"
  (
    cd "$work" || exit 1
    go mod init vela.local/seaweedfs-build >&2 || exit 1
    go mod download -json "$MODULE@$VERSION" >download.json || exit 1
    local gomod
    gomod="$(python3 -c 'import json; print(json.load(open("download.json"))["GoMod"])')" || exit 1
    go mod edit -json "$gomod" | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    old, new = r["Old"], r["New"]
    if not new.get("Version"):
        sys.exit("a local replace directive: " + new["Path"])
    lhs = old["Path"] + ("@" + old["Version"] if old.get("Version") else "")
    print("-replace=%s=%s@%s" % (lhs, new["Path"], new["Version"]))
' >replaces.txt || exit 1
    while read -r replace; do go mod edit "$replace" || exit 1; done <replaces.txt
    go get "$MODULE/weed@$VERSION" >&2 || exit 1
    go build -trimpath -ldflags "-s -w" -o "$WEED.tmp" "$MODULE/weed" >&2
  ) || die "building $MODULE/weed@$VERSION failed (caches kept in $gopath for a retry)"
  mv "$WEED.tmp" "$WEED"
  echo "seaweedfs.sh: weed built in $((SECONDS - started)) s" >&2
  go clean -modcache >&2 || true
  rm -rf "$gopath" "$work"
  echo "$WEED"
}

free_ports() {
  python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

serve() {
  local dir="$1"
  [ -n "$dir" ] || die "serve needs a data directory"
  local weed
  weed="$(build)"
  mkdir -p "$dir/data"
  if [ ! -s "$dir/ports" ]; then
    free_ports 8 >"$dir/ports"
  fi
  local master master_grpc volume volume_grpc filer filer_grpc s3 s3_grpc
  read -r master master_grpc volume volume_grpc filer filer_grpc s3 s3_grpc <"$dir/ports"
  cat >"$dir/s3.json" <<EOF
{"identities": [{"name": "vela", "credentials": [{"accessKey": "$ACCESS_KEY", "secretKey": "$SECRET_KEY"}],
  "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
EOF
  # Loopback only, no telemetry (on by default), none of the extra
  # listeners (Iceberg and Lance catalogs), sockets in DIR.
  "$weed" server -ip=127.0.0.1 -ip.bind=127.0.0.1 -dir="$dir/data" \
    -master.port="$master" -master.port.grpc="$master_grpc" -master.volumeSizeLimitMB=256 \
    -master.telemetry=false \
    -volume.port="$volume" -volume.port.grpc="$volume_grpc" -volume.max=16 -volume.preStopSeconds=0 \
    -filer.port="$filer" -filer.port.grpc="$filer_grpc" -filer.localSocket="$dir/filer.sock" \
    -s3 -s3.port="$s3" -s3.port.grpc="$s3_grpc" -s3.config="$dir/s3.json" \
    -s3.port.iceberg=0 -s3.port.lance=0 -s3.localSocket="$dir/s3.sock" \
    >>"$dir/weed.log" 2>&1 &
  local pid=$!
  trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; exit 0' TERM INT
  local endpoint="http://127.0.0.1:$s3"
  local deadline=$((SECONDS + STARTUP_TIMEOUT_S))
  # Up once the S3 port answers (403 without a signature).
  until curl -s -o /dev/null "$endpoint/"; do
    kill -0 "$pid" 2>/dev/null || { tail -n 40 "$dir/weed.log" >&2; die "weed exited"; }
    [ $SECONDS -lt $deadline ] || { tail -n 40 "$dir/weed.log" >&2; die "weed did not start"; }
    sleep 0.2
  done
  # The bucket, through weed's own shell: created unless listed (a restart
  # finds it in its data).
  local shell=("$weed" shell -master="127.0.0.1:$master.$master_grpc"
               -filer="127.0.0.1:$filer.$filer_grpc")
  bucket_listed() {
    echo "s3.bucket.list" | "${shell[@]}" >"$dir/buckets.txt" 2>>"$dir/weed.log" || true
    grep -qw -- "$BUCKET" "$dir/buckets.txt"
  }
  until bucket_listed; do
    kill -0 "$pid" 2>/dev/null || { tail -n 40 "$dir/weed.log" >&2; die "weed exited"; }
    [ $SECONDS -lt $deadline ] || { tail -n 40 "$dir/weed.log" >&2; die "bucket $BUCKET not created"; }
    echo "s3.bucket.create -name $BUCKET" | "${shell[@]}" >>"$dir/weed.log" 2>&1 || true
    sleep 0.5
  done
  echo "ready s3 $endpoint bucket $BUCKET"
  wait "$pid"
}

case "${1:-}" in
  build) build ;;
  serve) serve "${2:-}" ;;
  *) echo "usage: $0 build | serve DIR" >&2; exit 2 ;;
esac
