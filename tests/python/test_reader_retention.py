"""Data of a topic without subscriptions stays readable: ledgers roll over
as Pulsar rolls them (an entry or size cap, or 240 minutes, and never
before the minimum rollover age, 10 minutes), and a closed ledger of a topic
without subscriptions is kept at least that long, so a reader from the
earliest message reads every acknowledged message of the last 10 minutes,
also after kill -9 and a restart (which closes the recovered ledger and
opens a new one). The broker's ledger entry cap here is tiny and its policy
pass (retention, trimming) runs every second: without the rules above the
first ledgers would be gone within seconds."""

import json
import time
import uuid

import pulsar

from conftest import _start, _stop, http, kill9, restart

ENTRIES_CAP = 20
POLICY_CHECK_S = 1


def read_all_from_earliest(client, topic, expected):
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    got = []
    while len(got) < expected:
        got.append(reader.read_next(10000).data())
    assert not reader.has_message_available()
    reader.close()
    return got


def ledgers(broker, topic):
    status, body = http(broker, "GET", "/admin/v2/persistent/%s/internalStats" % topic[len("persistent://"):])
    assert status == 200, (status, body)
    return json.loads(body)["ledgers"]


def test_reader_from_earliest_reads_everything_recent_also_after_kill9():
    b = _start(["--ledger-max-entries", str(ENTRIES_CAP), "--policy-check-interval-s", str(POLICY_CHECK_S)])
    try:
        topic = "persistent://public/default/no-subs-" + uuid.uuid4().hex[:8]
        client = pulsar.Client(b.url, operation_timeout_seconds=10,
                               logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        producer = client.create_producer(topic, batching_enabled=False)
        sent = [b"m-%04d" % i for i in range(10 * ENTRIES_CAP)]
        for payload in sent:
            producer.send(payload)
        # Far past the entry cap, but younger than the minimum rollover age:
        # one ledger, and several policy passes later nothing is trimmed.
        assert len(ledgers(b, topic)) == 1
        time.sleep(3 * POLICY_CHECK_S)
        assert read_all_from_earliest(client, topic, len(sent)) == sent
        client.close()

        kill9(b)
        b = restart(b)
        client = pulsar.Client(b.url, operation_timeout_seconds=10,
                               logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        producer = client.create_producer(topic, batching_enabled=False)
        more = [b"n-%04d" % i for i in range(ENTRIES_CAP)]
        for payload in more:
            producer.send(payload)
        # The restart closed the recovered ledger: two ledgers now, the
        # closed one kept for readers through several trimming passes.
        assert len(ledgers(b, topic)) == 2
        time.sleep(3 * POLICY_CHECK_S)
        assert read_all_from_earliest(client, topic, len(sent) + len(more)) == sent + more
        client.close()
    finally:
        _stop(b)
