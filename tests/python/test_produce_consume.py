"""Produce and consume with the official client: sync and async sends,
batching on and off, every compression type."""

import threading

import pulsar
import pytest

COMPRESSIONS = [
    pulsar.CompressionType.NONE,
    pulsar.CompressionType.LZ4,
    pulsar.CompressionType.ZLib,
    pulsar.CompressionType.ZSTD,
    pulsar.CompressionType.SNAPPY,
]


def receive_all(consumer, count, timeout_ms=5000):
    out = []
    for _ in range(count):
        msg = consumer.receive(timeout_millis=timeout_ms)
        out.append(msg)
        consumer.acknowledge(msg)
    return out


@pytest.mark.parametrize("batching", [False, True])
@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_sync_produce_consume(client, topic, batching, compression):
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(
        topic, batching_enabled=batching, compression_type=compression, batching_max_publish_delay_ms=5
    )
    payloads = [("msg-%d-" % i).encode() * (1 + i % 50) for i in range(40)]
    ids = [producer.send(p) for p in payloads]
    assert len(set(str(i) for i in ids)) == len(ids)
    got = receive_all(consumer, len(payloads))
    assert [m.data() for m in got] == payloads
    producer.close()
    consumer.close()


@pytest.mark.parametrize("batching", [False, True])
@pytest.mark.parametrize("compression", [pulsar.CompressionType.NONE, pulsar.CompressionType.LZ4])
def test_async_produce_consume(client, topic, batching, compression):
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(
        topic,
        batching_enabled=batching,
        compression_type=compression,
        batching_max_messages=50,
        batching_max_publish_delay_ms=10,
        block_if_queue_full=True,
    )
    n = 500
    done = threading.Event()
    results = []
    lock = threading.Lock()

    def callback(res, msg_id):
        with lock:
            results.append(res)
            if len(results) == n:
                done.set()

    for i in range(n):
        producer.send_async(b"async-%d" % i, callback)
    producer.flush()
    assert done.wait(20)
    assert all(r == pulsar.Result.Ok for r in results)
    got = receive_all(consumer, n)
    assert [m.data() for m in got] == [b"async-%d" % i for i in range(n)]
    producer.close()
    consumer.close()


def test_properties_keys_and_event_time_survive(client, topic):
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"x", properties={"a": "1", "b": "2"}, partition_key="k1", event_timestamp=12345)
    msg = consumer.receive(timeout_millis=5000)
    assert msg.data() == b"x"
    assert msg.properties() == {"a": "1", "b": "2"}
    assert msg.partition_key() == "k1"
    assert msg.event_timestamp() == 12345
    assert msg.topic_name() == topic
    consumer.acknowledge(msg)


def test_large_message_near_limit(client, topic):
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    payload = bytes(range(256)) * (4 * 1024 * 4)  # 4 MiB
    producer.send(payload)
    msg = consumer.receive(timeout_millis=10000)
    assert msg.data() == payload


def test_two_producers_one_topic_and_generated_names(client, topic):
    p1 = client.create_producer(topic)
    p2 = client.create_producer(topic)
    assert p1.producer_name() != p2.producer_name()
    assert p1.producer_name().startswith("standalone-0-")
    assert p1.last_sequence_id() == -1


def test_producer_name_clash_is_busy(client, topic):
    client.create_producer(topic, producer_name="fixed-name")
    with pytest.raises(Exception) as err:
        client.create_producer(topic, producer_name="fixed-name")
    assert "Busy" in str(err.value) or "busy" in str(err.value)


def test_exclusive_producer_access_mode(client, topic):
    client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    with pytest.raises(Exception):
        client.create_producer(topic)


def test_unknown_namespace_is_refused(client):
    with pytest.raises(Exception):
        client.create_producer("persistent://no-such-tenant/ns/topic")


def test_wait_for_exclusive_gets_the_topic_when_it_frees(client, topic):
    first = client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    created = []

    def wait():
        created.append(client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.WaitForExclusive))

    waiter = threading.Thread(target=wait)
    waiter.start()
    waiter.join(0.5)
    assert not created, "WaitForExclusive producer was ready while the topic was held"
    first.close()
    waiter.join(10)
    assert created
    created[0].send(b"mine now")


def test_exclusive_with_fencing_takes_over(client, topic):
    client.create_producer(topic, producer_name="old-one")
    fencing = client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.ExclusiveWithFencing)
    fencing.send(b"fenced")
