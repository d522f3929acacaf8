"""Acknowledgements and redelivery with the official client."""

import time

import pulsar

EARLIEST = pulsar.InitialPosition.Earliest


def produce(client, topic, n, batching=False):
    producer = client.create_producer(topic, batching_enabled=batching, batching_max_publish_delay_ms=5)
    for i in range(n):
        producer.send_async(b"m-%d" % i, None)
    producer.flush()
    producer.close()


def receive_n(consumer, n, timeout_ms=5000):
    return [consumer.receive(timeout_millis=timeout_ms) for _ in range(n)]


def drain(consumer, timeout_ms=500):
    out = []
    while True:
        try:
            out.append(consumer.receive(timeout_millis=timeout_ms))
        except pulsar.Timeout:
            return out


def test_unacked_messages_come_back_after_consumer_close(client, topic):
    c = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared, initial_position=EARLIEST)
    produce(client, topic, 10)
    msgs = receive_n(c, 10)
    for m in msgs[:4]:
        c.acknowledge(m)
    c.close()
    c = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared, initial_position=EARLIEST)
    again = drain(c)
    assert sorted(m.data() for m in again) == sorted(b"m-%d" % i for i in range(4, 10))


def test_individual_acks_with_gaps_survive_resubscribe(client, topic):
    c = client.subscribe(topic, "s", initial_position=EARLIEST)
    produce(client, topic, 10)
    msgs = receive_n(c, 10)
    for m in msgs:
        if int(m.data().split(b"-")[1]) % 2 == 0:
            c.acknowledge(m)
    c.close()
    c = client.subscribe(topic, "s", initial_position=EARLIEST)
    again = drain(c)
    assert [m.data() for m in again] == [b"m-%d" % i for i in range(1, 10, 2)]


def test_cumulative_ack_acks_everything_before(client, topic):
    c = client.subscribe(topic, "s", initial_position=EARLIEST)
    produce(client, topic, 10)
    msgs = receive_n(c, 10)
    c.acknowledge_cumulative(msgs[6])
    c.close()
    c = client.subscribe(topic, "s", initial_position=EARLIEST)
    again = drain(c)
    assert [m.data() for m in again] == [b"m-%d" % i for i in range(7, 10)]


def test_cumulative_ack_in_a_batch(client, topic):
    c = client.subscribe(topic, "s", initial_position=EARLIEST)
    produce(client, topic, 10, batching=True)
    msgs = receive_n(c, 10)
    c.acknowledge_cumulative(msgs[-1])
    c.close()
    c = client.subscribe(topic, "s", initial_position=EARLIEST)
    assert drain(c) == []


def test_negative_ack_redelivers_with_a_count(client, topic):
    c = client.subscribe(
        topic,
        "s",
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=EARLIEST,
        negative_ack_redelivery_delay_ms=100,
    )
    produce(client, topic, 3)
    msgs = receive_n(c, 3)
    c.negative_acknowledge(msgs[1])
    c.acknowledge(msgs[0])
    c.acknowledge(msgs[2])
    again = c.receive(timeout_millis=5000)
    assert again.data() == b"m-1"
    assert again.redelivery_count() == 1
    c.negative_acknowledge(again)
    third = c.receive(timeout_millis=5000)
    assert third.data() == b"m-1"
    assert third.redelivery_count() == 2
    c.acknowledge(third)
    assert drain(c) == []


def test_negative_ack_on_exclusive_redelivers(client, topic):
    c = client.subscribe(topic, "s", initial_position=EARLIEST, negative_ack_redelivery_delay_ms=100)
    produce(client, topic, 2)
    msgs = receive_n(c, 2)
    c.acknowledge(msgs[0])
    c.negative_acknowledge(msgs[1])
    again = c.receive(timeout_millis=5000)
    assert again.data() == b"m-1"
    c.acknowledge(again)


def test_shared_consumer_close_moves_messages_to_the_other(client, topic):
    c1 = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=100)
    c2 = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=100)
    produce(client, topic, 20)
    time.sleep(0.5)
    c1.close()  # everything c1 held unacked goes to c2
    got = set()
    for m in drain(c2, timeout_ms=1000):
        got.add(m.data())
        c2.acknowledge(m)
    assert got == {b"m-%d" % i for i in range(20)}


def test_batch_index_ack(client, topic):
    c = client.subscribe(
        topic,
        "s",
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=EARLIEST,
        batch_index_ack_enabled=True,
    )
    producer = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=50)
    for i in range(6):
        producer.send_async(b"b-%d" % i, None)
    producer.flush()
    msgs = receive_n(c, 6)
    for m in msgs[:3]:
        c.acknowledge(m)
    time.sleep(0.3)
    c.close()
    c = client.subscribe(
        topic,
        "s",
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=EARLIEST,
        batch_index_ack_enabled=True,
    )
    again = drain(c)
    assert sorted(m.data() for m in again) == [b"b-3", b"b-4", b"b-5"]


def test_delayed_delivery_on_shared(client, topic):
    from datetime import timedelta

    c = client.subscribe(topic, "delayed", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(topic, batching_enabled=False)
    start = time.time()
    producer.send(b"later", deliver_after=timedelta(milliseconds=800))
    producer.send(b"now")
    first = c.receive(timeout_millis=5000)
    assert first.data() == b"now"
    c.acknowledge(first)
    second = c.receive(timeout_millis=5000)
    assert second.data() == b"later"
    assert time.time() - start >= 0.7
    c.acknowledge(second)


def test_dead_letter_topic_after_max_redeliveries(client, topic):
    dlq = topic + "-dlq"
    dlq_consumer = client.subscribe(dlq, "dlq", initial_position=EARLIEST)
    c = client.subscribe(
        topic,
        "s",
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=EARLIEST,
        negative_ack_redelivery_delay_ms=100,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=2, dead_letter_topic=dlq),
    )
    produce(client, topic, 1)
    counts = []
    for _ in range(3):
        m = c.receive(timeout_millis=5000)
        counts.append(m.redelivery_count())
        c.negative_acknowledge(m)
    assert counts == [0, 1, 2]
    dead = dlq_consumer.receive(timeout_millis=10000)
    assert dead.data() == b"m-0"
    dlq_consumer.acknowledge(dead)
    # The C++ client acks the original and closes its internal DLQ producer
    # asynchronously; closing the client in the middle of that has been seen
    # to crash the client library (a client bug), so let it settle first.
    time.sleep(0.5)
    c.close()
    dlq_consumer.close()


def _redelivered_after_close(broker, client, topic, consumer_type, close):
    """A consumer of `consumer_type` takes messages without acking them and
    goes away (`close(consumer, its client)`); the other consumer of the
    subscription gets them with redelivery_count 1, as Pulsar counts them
    (PersistentDispatcherMultipleConsumers.removeConsumer)."""
    leaving_client = pulsar.Client(broker.url, operation_timeout_seconds=10,
                                   logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    leaving = leaving_client.subscribe(topic, "s", consumer_type=consumer_type, initial_position=EARLIEST,
                                       receiver_queue_size=100)
    produce(client, topic, 10)
    taken = receive_n(leaving, 10)
    assert all(m.redelivery_count() == 0 for m in taken)
    staying = client.subscribe(topic, "s", consumer_type=consumer_type, initial_position=EARLIEST)
    close(leaving, leaving_client)
    again = receive_n(staying, 10)
    assert sorted(m.data() for m in again) == sorted(b"m-%d" % i for i in range(10))
    assert [m.redelivery_count() for m in again] == [1] * 10
    for m in again:
        staying.acknowledge(m)
    staying.close()


def _close_consumer(consumer, its_client):
    consumer.close()
    its_client.close()


def _close_client(consumer, its_client):
    # The whole client goes (its connection closes under the consumer).
    its_client.close()


def test_shared_unacked_messages_of_a_closed_consumer_count_as_redelivered(broker, client, topic):
    _redelivered_after_close(broker, client, topic, pulsar.ConsumerType.Shared, _close_consumer)


def test_key_shared_unacked_messages_of_a_disconnected_consumer_count_as_redelivered(broker, client, topic):
    _redelivered_after_close(broker, client, topic, pulsar.ConsumerType.KeyShared, _close_client)


def test_redelivery_counts_restart_when_the_last_consumer_leaves(client, topic):
    c = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared, initial_position=EARLIEST)
    produce(client, topic, 3)
    receive_n(c, 3)
    c.close()
    # Pulsar clears its redelivery tracker when a subscription has no consumer left.
    c = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared, initial_position=EARLIEST)
    assert [m.redelivery_count() for m in receive_n(c, 3)] == [0, 0, 0]
    c.close()
