#!/usr/bin/env bash
# The official-client suite: Python `pulsar-client` (the C++ client) against a
# real `vela standalone` per session (and private ones for restart tests).
# Called by ./test.sh; VELA_TEST_FULL=1 runs the longer variants.
set -euo pipefail
cd "$(dirname "$0")/python"

missing=()
python3 -c 'import pulsar' 2>/dev/null || missing+=(pulsar-client)
# The schema tests' Avro schemas: pulsar-client's `avro` extra (fastavro);
# a pulsar-client installed without that extra lacks it.
python3 -c 'import fastavro' 2>/dev/null || missing+=(fastavro)
python3 -c 'import pytest' 2>/dev/null || missing+=(pytest)
python3 -c 'import pytest_timeout' 2>/dev/null || missing+=(pytest-timeout)
python3 -c 'import prometheus_client' 2>/dev/null || missing+=(prometheus-client)
python3 -c 'import cryptography' 2>/dev/null || missing+=(cryptography)
python3 -c "import bcrypt" 2>/dev/null || missing+=(bcrypt)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing Python packages: ${missing[*]}"
  python3 -m pip install --quiet --disable-pip-version-check "${missing[@]}"
fi

# Per-test timeout: a hang fails its test instead of the whole CI run.
exec python3 -m pytest -q --timeout 300 -p no:cacheprovider "$@"
