"""Producer access modes as Pulsar answers them, with the official client:
a second Exclusive producer is fenced (ProducerFenced, not retried) and a
Shared one busy; ExclusiveWithFencing fences the holder, whose next send
fails at once with ProducerFenced (its reconnect brings back an epoch the
topic has moved past) instead of hanging until its send timeout;
WaitForExclusive waits for the holder to go."""

import threading
import time
import uuid

import pulsar
import pytest
from pulsar import ProducerAccessMode


def new_topic():
    return "persistent://public/default/access-" + uuid.uuid4().hex[:12]


def test_second_exclusive_is_fenced_and_shared_is_busy(client):
    topic = new_topic()
    holder = client.create_producer(topic, producer_name="p1", access_mode=ProducerAccessMode.Exclusive)
    with pytest.raises(pulsar.ProducerFenced):
        client.create_producer(topic, producer_name="p2", access_mode=ProducerAccessMode.Exclusive)
    with pytest.raises(pulsar.ProducerBusy):
        client.create_producer(topic, producer_name="p3")
    holder.send(b"still the holder")
    holder.close()
    # The topic is free again.
    client.create_producer(topic, producer_name="p2", access_mode=ProducerAccessMode.Exclusive).close()


def test_exclusive_with_fencing_fences_the_holder_for_good(client):
    topic = new_topic()
    old = client.create_producer(topic, producer_name="old", access_mode=ProducerAccessMode.Exclusive,
                                 send_timeout_millis=30000)
    old.send(b"before")
    new = client.create_producer(topic, producer_name="new",
                                 access_mode=ProducerAccessMode.ExclusiveWithFencing)
    started = time.time()
    with pytest.raises((pulsar.ProducerFenced, pulsar.AlreadyClosed)):
        old.send(b"after fencing")
    # Fenced is final: no wait for the 30 s send timeout.
    assert time.time() - started < 10
    new.send(b"from the new holder")
    new.close()
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    seen = [reader.read_next(10000).data() for _ in range(2)]
    assert seen == [b"before", b"from the new holder"]
    reader.close()


def test_wait_for_exclusive_gets_the_topic_when_the_holder_leaves(client):
    topic = new_topic()
    holder = client.create_producer(topic, producer_name="holder", access_mode=ProducerAccessMode.Exclusive)
    got = {}

    def wait():
        p = client.create_producer(topic, producer_name="waiter",
                                   access_mode=ProducerAccessMode.WaitForExclusive)
        got["at"] = time.time()
        p.send(b"from the waiter")
        p.close()

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(1.0)
    assert "at" not in got, "the waiter got the topic while it was held"
    closed_at = time.time()
    holder.close()
    t.join(30)
    assert got.get("at", 0) >= closed_at
