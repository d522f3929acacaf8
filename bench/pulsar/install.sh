#!/usr/bin/env bash
# Installs Apache Pulsar standalone and pulsar-perf from the official jars on
# Maven Central (pom.xml: pulsar-broker + pulsar-testclient) into
# bench/pulsar/dist/lib, which is gitignored. Idempotent: does nothing when
# the jars of this pom.xml are already there.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

need() { command -v "$1" >/dev/null 2>&1; }
if ! need java || ! need mvn; then
    if [ "$(id -u)" = 0 ] && need apt-get; then
        echo "installing Java 17 and Maven (apt-get)..."
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless maven >/dev/null
    else
        echo "error: Apache Pulsar needs java (17+) and mvn on the PATH" >&2
        exit 1
    fi
fi
java_major="$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)"
if [ -z "$java_major" ] || [ "$java_major" -lt 17 ]; then
    echo "error: Apache Pulsar 4 needs Java 17 or newer (found: ${java_major:-none})" >&2
    exit 1
fi

stamp="dist/.installed-$(sha256sum pom.xml settings.xml | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ -d dist/lib ]; then
    echo "Apache Pulsar already installed in $here/dist/lib"
    exit 0
fi
rm -rf dist
mkdir -p dist
echo "fetching Apache Pulsar jars from Maven Central (about 240 MB)..."
if ! mvn -B -q -s settings.xml dependency:copy-dependencies \
        -DoutputDirectory=dist/lib >dist/mvn.log 2>&1; then
    echo "error: mvn failed; the end of its log (bench/pulsar/dist/mvn.log):" >&2
    tail -20 dist/mvn.log >&2
    exit 1
fi
ls dist/lib/pulsar-broker-*.jar dist/lib/pulsar-testclient-*.jar >/dev/null
touch "$stamp"
echo "Apache Pulsar installed: $(ls dist/lib | wc -l) jars in $here/dist/lib"
