#!/usr/bin/env bash
# The cluster suite: etcd + 3 bookies + 2 brokers as real processes on
# 127.0.0.1, failures injected (kill -9, SIGSTOP), checked with the official
# Python client. Called by ./test.sh; VELA_TEST_FULL=1 adds the slow cases.
set -euo pipefail
cd "$(dirname "$0")/cluster"

missing=()
python3 -c 'import pulsar' 2>/dev/null || missing+=(pulsar-client)
python3 -c 'import pytest' 2>/dev/null || missing+=(pytest)
python3 -c 'import pytest_timeout' 2>/dev/null || missing+=(pytest-timeout)
python3 -c 'import cryptography' 2>/dev/null || missing+=(cryptography)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing Python packages: ${missing[*]}"
  python3 -m pip install --quiet --disable-pip-version-check "${missing[@]}"
fi
command -v etcd >/dev/null || { echo "etcd is missing (./test.sh installs etcd-server)" >&2; exit 1; }

exec python3 -m pytest -q -s --timeout 600 -p no:cacheprovider "$@"
