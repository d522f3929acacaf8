#!/usr/bin/env bash
# Vela and Apache Pulsar side by side: installs Pulsar (install.sh) if
# needed, then runs every scenario on both (bench/run.sh). Arguments go to
# bench/run.sh, e.g. `bench/pulsar/run.sh sync-1k --bookies 1`.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$here/install.sh"
exec "$here/../run.sh" --systems vela,pulsar "$@"
