"""Readers (non-durable subscriptions), seek and last-message-id."""

import time

import pulsar


def produce(client, topic, n, prefix="m", batching=False):
    producer = client.create_producer(topic, batching_enabled=batching, batching_max_publish_delay_ms=5)
    ids = [producer.send(b"%s-%d" % (prefix.encode(), i)) for i in range(n)]
    producer.close()
    return ids


def read_all(reader, timeout_ms=500):
    out = []
    while True:
        try:
            out.append(reader.read_next(timeout_millis=timeout_ms).data())
        except pulsar.Timeout:
            return out


def test_reader_from_earliest(client, topic):
    produce(client, topic, 5)
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert read_all(reader) == [b"m-%d" % i for i in range(5)]


def test_reader_from_latest_sees_only_new(client, topic):
    produce(client, topic, 3)
    reader = client.create_reader(topic, pulsar.MessageId.latest)
    produce(client, topic, 2, prefix="new")
    assert read_all(reader) == [b"new-0", b"new-1"]


def test_reader_from_a_message_id_is_exclusive(client, topic):
    ids = produce(client, topic, 6)
    reader = client.create_reader(topic, ids[2])
    assert read_all(reader) == [b"m-3", b"m-4", b"m-5"]


def test_reader_from_a_message_id_inclusive(client, topic):
    ids = produce(client, topic, 6)
    reader = client.create_reader(topic, ids[2], start_message_id_inclusive=True)
    assert read_all(reader) == [b"m-2", b"m-3", b"m-4", b"m-5"]


def test_reader_inside_a_batch(client, topic):
    producer = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=50)
    for i in range(5):
        producer.send_async(b"b-%d" % i, None)
    producer.flush()
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    msgs = [reader.read_next(timeout_millis=5000) for _ in range(5)]
    reader2 = client.create_reader(topic, msgs[1].message_id())
    assert read_all(reader2) == [b"b-2", b"b-3", b"b-4"]


def test_has_message_available(client, topic):
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert not reader.has_message_available()
    produce(client, topic, 2, batching=True)
    assert reader.has_message_available()
    reader.read_next(timeout_millis=5000)
    reader.read_next(timeout_millis=5000)
    assert not reader.has_message_available()


def test_two_readers_are_independent(client, topic):
    produce(client, topic, 3)
    r1 = client.create_reader(topic, pulsar.MessageId.earliest)
    r2 = client.create_reader(topic, pulsar.MessageId.earliest)
    assert read_all(r1) == read_all(r2) == [b"m-0", b"m-1", b"m-2"]


def test_seek_to_message_id(client, topic):
    ids = produce(client, topic, 6)
    c = client.subscribe(topic, "seek", initial_position=pulsar.InitialPosition.Earliest)
    for _ in range(6):
        c.acknowledge(c.receive(timeout_millis=5000))
    c.seek(ids[2])
    got = []
    while True:
        try:
            m = c.receive(timeout_millis=2000)
        except pulsar.Timeout:
            break
        got.append(m.data())
        c.acknowledge(m)
    # The broker restarts at the seek entry itself (as the Java broker); the
    # C++ client then drops the entry it seeked to (its start id is exclusive).
    assert got == [b"m-3", b"m-4", b"m-5"]


def test_seek_to_earliest_and_by_time(client, topic):
    produce(client, topic, 3, prefix="a")
    time.sleep(0.05)
    middle_ms = int(time.time() * 1000)
    time.sleep(0.05)
    produce(client, topic, 2, prefix="b")
    c = client.subscribe(topic, "seek", initial_position=pulsar.InitialPosition.Earliest)
    for _ in range(5):
        c.acknowledge(c.receive(timeout_millis=5000))
    c.seek(pulsar.MessageId.earliest)
    assert [c.receive(timeout_millis=5000).data() for _ in range(5)] == [
        b"a-0", b"a-1", b"a-2", b"b-0", b"b-1"
    ]
    c.seek(middle_ms)
    assert [c.receive(timeout_millis=5000).data() for _ in range(2)] == [b"b-0", b"b-1"]


def test_reader_seek(client, topic):
    ids = produce(client, topic, 4)
    reader = client.create_reader(topic, pulsar.MessageId.latest)
    reader.seek(ids[0])
    assert read_all(reader, timeout_ms=2000) == [b"m-1", b"m-2", b"m-3"]
