"""Topic-level and namespace policies with the official client: each one set
over the admin REST API (Pulsar's routes) and seen in what clients get, the
topic's value over its namespace's, its namespace's over the broker's; they
survive a restart. Also: delayed delivery on Key_Shared, a producer's
initial subscription (the dead-letter topic's), schemas registered over
REST, and messages read back over REST.
"""

import datetime
import json
import time
import uuid

import pulsar
import pytest

from conftest import (
    POLICY_BROKER_CHECK_INTERVAL_S,
    POLICY_BROKER_LEDGER_ENTRIES_MAX,
    _start,
    _stop,
    create_namespace,
    http,
    quiet_client,
    restart,
    start_policy_broker,
)

POLICY_CHECK_INTERVAL_S = POLICY_BROKER_CHECK_INTERVAL_S
LEDGER_ENTRIES_MAX = POLICY_BROKER_LEDGER_ENTRIES_MAX
WAIT_S = 20


@pytest.fixture(scope="module")
def pb():
    b = start_policy_broker()
    yield b
    _stop(b)


new_client = quiet_client


@pytest.fixture
def pc(pb):
    c = new_client(pb)
    yield c
    c.close()


def new_namespace(b):
    return create_namespace(b, "tp")


def rest(topic):
    return "/admin/v2/persistent/" + topic[len("persistent://"):]


def create_topic(b, topic, partitions=0):
    if partitions:
        status, body = http(b, "PUT", rest(topic) + "/partitions", str(partitions))
    else:
        status, body = http(b, "PUT", rest(topic))
    assert status == 204, (status, body)


def set_topic_policy(b, topic, what, value, query=""):
    status, body = http(b, "POST", rest(topic) + "/" + what + query, json.dumps(value))
    assert status == 204, (what, status, body)


def get_topic_policy(b, topic, what, applied=False):
    status, body = http(b, "GET", rest(topic) + "/" + what + ("?applied=true" if applied else ""))
    assert status in (200, 204), (what, status, body)
    return json.loads(body) if status == 200 else None


def set_ns_policy(b, ns, what, value):
    status, body = http(b, "POST", "/admin/v2/namespaces/%s/%s" % (ns, what), json.dumps(value))
    assert status == 204, (what, status, body)


def stats(b, topic):
    status, body = http(b, "GET", rest(topic) + "/stats")
    assert status == 200, (status, body)
    return json.loads(body)


def wait_until(what, predicate, timeout_s=WAIT_S):
    deadline = time.time() + timeout_s
    last = None
    while time.time() < deadline:
        ok, last = predicate()
        if ok:
            return last
        time.sleep(0.2)
    raise AssertionError("timed out waiting for %s (last: %r)" % (what, last))


def publish(client, topic, count, size=1000):
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(count):
        producer.send(b"%06d" % i + b"x" * (size - 6))
    producer.close()


def test_policies_round_trip_and_unset_answers_204(pb):
    ns = new_namespace(pb)
    topic = "persistent://%s/rt" % ns
    create_topic(pb, topic, partitions=2)
    assert get_topic_policy(pb, topic, "maxProducers") is None
    set_topic_policy(pb, topic, "maxProducers", 3)
    assert get_topic_policy(pb, topic, "maxProducers") == 3
    rate = {"publishThrottlingRateInMsg": 10, "publishThrottlingRateInByte": -1}
    set_topic_policy(pb, topic, "publishRate", rate)
    assert get_topic_policy(pb, topic, "publishRate") == rate
    status, _ = http(pb, "POST", rest(topic) + "/messageTTL?messageTTL=600")
    assert status == 204
    assert get_topic_policy(pb, topic, "messageTTL") == 600
    # Refusals carry Pulsar's reasons.
    status, body = http(pb, "POST", rest(topic) + "/maxProducers", "-1")
    assert status == 412 and json.loads(body)["reason"] == "maxProducers must be 0 or more"
    status, body = http(pb, "POST", "/admin/v2/namespaces/%s/maxTopicsPerNamespace" % ns, "-1")
    assert status == 412, (status, body)
    # Applied: the namespace's value when the topic has none.
    set_ns_policy(pb, ns, "maxConsumersPerTopic", 7)
    assert get_topic_policy(pb, topic, "maxConsumers") is None
    assert get_topic_policy(pb, topic, "maxConsumers", applied=True) == 7
    status, _ = http(pb, "DELETE", rest(topic) + "/maxProducers")
    assert status == 204
    assert get_topic_policy(pb, topic, "maxProducers") is None
    status, _ = http(pb, "GET", "/admin/v2/namespaces/%s/persistence" % ns)
    assert status == 204
    # Properties merge, and a key is removed alone.
    status, _ = http(pb, "PUT", rest(topic) + "/properties", json.dumps({"a": "1", "b": "2"}))
    assert status == 204
    status, _ = http(pb, "DELETE", rest(topic) + "/properties?key=a")
    assert status == 204
    status, body = http(pb, "GET", rest(topic) + "/properties")
    assert json.loads(body) == {"b": "2"}


def test_max_producers_topic_over_namespace_over_broker(pb, pc):
    ns = new_namespace(pb)
    set_ns_policy(pb, ns, "maxProducersPerTopic", 2)
    limited = "persistent://%s/one" % ns
    other = "persistent://%s/two" % ns
    create_topic(pb, limited)
    set_topic_policy(pb, limited, "maxProducers", 1)
    first = pc.create_producer(limited)
    with pytest.raises(pulsar.ProducerBusy):
        pc.create_producer(limited)
    # The sibling topic has the namespace's limit: 2.
    others = [pc.create_producer(other), pc.create_producer(other)]
    with pytest.raises(pulsar.ProducerBusy):
        pc.create_producer(other)
    # Without the topic's own value, the namespace's applies to it too.
    status, _ = http(pb, "DELETE", rest(limited) + "/maxProducers")
    assert status == 204
    second = pc.create_producer(limited)
    for p in [first, second] + others:
        p.close()


def test_max_consumers_and_subscriptions(pb, pc):
    ns = new_namespace(pb)
    topic = "persistent://%s/subs" % ns
    create_topic(pb, topic)
    set_topic_policy(pb, topic, "maxSubscriptionsPerTopic", 1)
    set_topic_policy(pb, topic, "maxConsumers", 2)
    a = pc.subscribe(topic, "a", consumer_type=pulsar.ConsumerType.Shared)
    with pytest.raises(pulsar.NotAllowedError):
        pc.subscribe(topic, "b")
    b = pc.subscribe(topic, "a", consumer_type=pulsar.ConsumerType.Shared)
    with pytest.raises(pulsar.ConsumerBusy):
        pc.subscribe(topic, "a", consumer_type=pulsar.ConsumerType.Shared)
    a.close()
    b.close()


def test_topic_ttl_expires_only_that_topic(pb, pc):
    ns = new_namespace(pb)
    set_ns_policy(pb, ns, "messageTTL", 3600)
    expiring = "persistent://%s/short" % ns
    kept = "persistent://%s/long" % ns
    for topic in (expiring, kept):
        pc.subscribe(topic, "slow").close()
        publish(pc, topic, 5)
    time.sleep(1.5)
    set_topic_policy(pb, expiring, "messageTTL", 1)

    def expired():
        backlog = stats(pb, expiring)["subscriptions"]["slow"]["msgBacklog"]
        return backlog == 0, backlog
    wait_until("the topic's TTL to expire its backlog", expired)
    time.sleep(2 * POLICY_CHECK_INTERVAL_S)
    assert stats(pb, kept)["subscriptions"]["slow"]["msgBacklog"] == 5


def test_topic_retention_keeps_consumed_data(pb, pc):
    ns = new_namespace(pb)
    kept = "persistent://%s/kept" % ns
    freed = "persistent://%s/freed" % ns
    create_topic(pb, kept)
    set_topic_policy(pb, kept, "retention", {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})
    for topic in (kept, freed):
        consumer = pc.subscribe(topic, "all")
        publish(pc, topic, 4 * LEDGER_ENTRIES_MAX)
        for _ in range(4 * LEDGER_ENTRIES_MAX):
            consumer.acknowledge(consumer.receive(timeout_millis=10000))
        consumer.close()

    def dropped():
        size = stats(pb, freed)["storageSize"]
        return size <= 2 * LEDGER_ENTRIES_MAX * 1000, size
    wait_until("the namespace default (no retention) to free the other topic", dropped)
    assert stats(pb, kept)["storageSize"] >= 4 * LEDGER_ENTRIES_MAX * 1000
    reader = pc.create_reader(kept, pulsar.MessageId.earliest)
    assert reader.read_next(timeout_millis=10000).data().startswith(b"000000")
    reader.close()


def test_topic_publish_rate_throttles(pb, pc):
    topic = "persistent://%s/rate" % new_namespace(pb)
    create_topic(pb, topic)
    rate = 50
    set_topic_policy(pb, topic, "publishRate", {"publishThrottlingRateInMsg": rate, "publishThrottlingRateInByte": -1})
    producer = pc.create_producer(topic, batching_enabled=False, max_pending_messages=1000)
    count = 3 * rate
    results = []
    started = time.time()
    for i in range(count):
        producer.send_async(b"%06d" % i, lambda res, _id: results.append(res))
    wait_until("every send answered", lambda: (len(results) == count, len(results)), timeout_s=60)
    elapsed = time.time() - started
    assert all(r == pulsar.Result.Ok for r in results)
    # One second of burst, then the rate.
    assert elapsed >= (count - rate) / rate * 0.8, "not throttled: %.2f s" % elapsed
    # Removed: the topic is back to the broker's (unlimited) rate at once.
    status, _ = http(pb, "DELETE", rest(topic) + "/publishRate")
    assert status == 204
    results.clear()
    started = time.time()
    for i in range(count):
        producer.send_async(b"%06d" % i, lambda res, _id: results.append(res))
    wait_until("every send answered", lambda: (len(results) == count, len(results)), timeout_s=60)
    assert time.time() - started < elapsed
    producer.close()


@pytest.mark.parametrize("policy", ["dispatchRate", "subscriptionDispatchRate"])
def test_dispatch_rate_throttles_delivery(pb, pc, policy):
    # dispatchRate is the topic's, shared by its subscriptions;
    # subscriptionDispatchRate is each subscription's own.
    topic = "persistent://%s/dispatch" % new_namespace(pb)
    create_topic(pb, topic)
    rate, count = 10, 30
    set_topic_policy(pb, topic, policy, {"dispatchThrottlingRateInMsg": rate, "dispatchThrottlingRateInByte": -1,
                                         "ratePeriodInSecond": 1, "relativeToPublishRate": False})
    consumers = [pc.subscribe(topic, "sub-%d" % i) for i in range(2)]
    producer = pc.create_producer(topic, batching_enabled=False)

    def deliver_all():
        started = time.time()
        for i in range(count):
            producer.send(b"%06d" % i)
        for consumer in consumers:
            got = [consumer.receive(timeout_millis=30000) for _ in range(count)]
            assert [m.data() for m in got] == [b"%06d" % i for i in range(count)]
            for m in got:
                consumer.acknowledge(m)
        return time.time() - started

    elapsed = deliver_all()
    # One period of burst, then the rate.
    delivered = count * (2 if policy == "dispatchRate" else 1)
    assert elapsed >= (delivered - rate) / rate * 0.8, "not throttled: %.2f s" % elapsed
    # Removed: subscriptions send at once again.
    status, _ = http(pb, "DELETE", rest(topic) + "/" + policy)
    assert status == 204
    assert deliver_all() < elapsed
    producer.close()
    for consumer in consumers:
        consumer.close()


def _send_errors(b):
    """The broker's vela_send_errors_total."""
    status, raw = http(b, "GET", "/metrics")
    assert status == 200, raw
    for line in raw.decode().splitlines():
        if line.startswith("vela_send_errors_total"):
            return float(line.split()[-1])
    raise AssertionError("no vela_send_errors_total in /metrics")


def test_max_message_size_refuses_larger_sends(pb, pc):
    """A send over the topic's maxMessageSize is answered with a send error
    (Pulsar's NotAllowedError "Exceed maximum message size") and never
    stored. The C++ client under the Python one answers any send error but
    a checksum error by reconnecting and sending again (as it does against
    Pulsar), so the refused send stays pending, refused again on every
    connection, until the producer closes: it never succeeds."""
    topic = "persistent://%s/size" % new_namespace(pb)
    create_topic(pb, topic)
    set_topic_policy(pb, topic, "maxMessageSize", 2000)
    producer = pc.create_producer(topic, batching_enabled=False)
    producer.send(b"x" * 100)
    refused_before = _send_errors(pb)
    outcomes = []
    producer.send_async(b"x" * 5000, lambda result, _id: outcomes.append(result))
    deadline = time.time() + WAIT_S
    while _send_errors(pb) < refused_before + 2 and time.time() < deadline:
        time.sleep(0.05)
    assert _send_errors(pb) >= refused_before + 2, "the oversized send was not refused"
    status, body = http(pb, "GET", rest(topic) + "/internalStats")
    assert status == 200, body
    assert json.loads(body)["numberOfEntries"] == 1, "the oversized message was stored"
    assert outcomes == [], outcomes
    producer.close()
    assert len(outcomes) == 1 and outcomes[0] != pulsar.Result.Ok, outcomes


def test_max_topics_per_namespace_refuses_the_next_topic(pb, pc):
    ns = new_namespace(pb)
    set_ns_policy(pb, ns, "maxTopicsPerNamespace", 2)
    create_topic(pb, "persistent://%s/t1" % ns)
    pc.create_producer("persistent://%s/t2" % ns).close()  # auto-created
    status, body = http(pb, "PUT", rest("persistent://%s/t3" % ns))
    assert status == 412, (status, body)
    assert json.loads(body)["reason"] == "Exceed maximum number of topics in namespace"
    with pytest.raises(pulsar.PulsarException):
        pc.create_producer("persistent://%s/t4" % ns)
    # Existing topics are unaffected.
    pc.create_producer("persistent://%s/t1" % ns).close()


def test_auto_subscription_creation_off(pb, pc):
    ns = new_namespace(pb)
    topic = "persistent://%s/auto-sub" % ns
    pc.subscribe(topic, "existing").close()
    set_ns_policy(pb, ns, "autoSubscriptionCreation", {"allowAutoSubscriptionCreation": False})
    with pytest.raises(pulsar.PulsarException):
        pc.subscribe(topic, "new-one")
    pc.subscribe(topic, "existing").close()
    # The topic's own value wins over its namespace's.
    set_topic_policy(pb, topic, "autoSubscriptionCreation", {"allowAutoSubscriptionCreation": True})
    pc.subscribe(topic, "new-one").close()


def test_policies_survive_a_restart():
    b = _start()
    try:
        topic = "persistent://public/default/restart-" + uuid.uuid4().hex[:8]
        create_topic(b, topic)
        set_topic_policy(b, topic, "maxProducers", 1)
        b.terminate(30)
        b = restart(b)
        assert get_topic_policy(b, topic, "maxProducers") == 1
        c = new_client(b)
        p = c.create_producer(topic)
        with pytest.raises(pulsar.ProducerBusy):
            c.create_producer(topic)
        p.close()
        c.close()
    finally:
        _stop(b)


def test_dynamic_configuration_sets_the_broker_default(pb, pc):
    topic = "persistent://%s/dyn" % new_namespace(pb)
    status, body = http(pb, "POST", "/admin/v2/brokers/configuration/maxProducersPerTopic/1")
    assert status == 200, (status, body)
    try:
        p = pc.create_producer(topic)
        with pytest.raises(pulsar.ProducerBusy):
            pc.create_producer(topic)
        p.close()
        status, body = http(pb, "GET", "/admin/v2/brokers/configuration/values")
        assert json.loads(body)["maxProducersPerTopic"] == "1"
        status, body = http(pb, "POST", "/admin/v2/brokers/configuration/brokerServicePort/1")
        assert status == 412, (status, body)
    finally:
        status, _ = http(pb, "DELETE", "/admin/v2/brokers/configuration/maxProducersPerTopic")
        assert status == 204


@pytest.mark.parametrize("active", [True, False], ids=["delayed", "policy-off"])
def test_key_shared_delayed_delivery(pb, pc, active):
    topic = "persistent://%s/ks-delayed" % new_namespace(pb)
    create_topic(pb, topic)
    if not active:
        set_topic_policy(pb, topic, "delayedDelivery", {"active": False, "tickTime": 1000})
    consumer = pc.subscribe(topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared)
    producer = pc.create_producer(topic, batching_enabled=False)
    delay_s = 3
    sent_at = time.time()
    producer.send(b"later", partition_key="k", deliver_after=datetime.timedelta(seconds=delay_s))
    msg = consumer.receive(timeout_millis=20000)
    waited = time.time() - sent_at
    assert msg.data() == b"later"
    if active:
        assert waited >= delay_s - 0.05, waited
    else:
        assert waited < delay_s, waited
    consumer.acknowledge(msg)
    producer.close()
    consumer.close()


def test_dead_letter_initial_subscription_keeps_messages(pb, pc):
    ns = new_namespace(pb)
    topic = "persistent://%s/dlq-src" % ns
    dlq = "persistent://%s/dlq-dead" % ns
    consumer = pc.subscribe(
        topic,
        "work",
        consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=100,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(
            max_redeliver_count=1, dead_letter_topic=dlq, initial_subscription_name="dead-sub"
        ),
    )
    producer = pc.create_producer(topic, batching_enabled=False)
    producer.send(b"poison")
    for _ in range(2):
        consumer.negative_acknowledge(consumer.receive(timeout_millis=10000))
    # The DLQ producer created the subscription before sending: a consumer
    # that comes later still gets the message.
    wait_until(
        "the dead-letter subscription",
        lambda: (http(pb, "GET", rest(dlq) + "/subscriptions")[0] == 200
                 and "dead-sub" in json.loads(http(pb, "GET", rest(dlq) + "/subscriptions")[1]), None),
    )
    dead = pc.subscribe(dlq, "dead-sub")
    assert dead.receive(timeout_millis=10000).data() == b"poison"
    dead.close()
    producer.close()
    consumer.close()


def test_schema_registered_over_rest_checks_producers(pb, pc):
    topic = "persistent://%s/schema" % new_namespace(pb)
    path = "/admin/v2/schemas/" + topic[len("persistent://"):]
    definition = json.dumps(
        {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}
    )
    status, body = http(pb, "POST", path + "/schema", json.dumps({"type": "AVRO", "schema": definition, "properties": {}}))
    assert status == 200, (status, body)
    status, body = http(pb, "GET", path + "/schema")
    got = json.loads(body)
    assert (got["version"], got["type"], got["data"]) == (0, "AVRO", definition)
    assert got["timestamp"] > 0
    # A producer of another type is refused; the schema posted stands.
    with pytest.raises(pulsar.IncompatibleSchema):
        pc.create_producer(topic, schema=pulsar.schema.StringSchema())
    status, _ = http(pb, "DELETE", path + "/schema")
    assert status == 200
    status, _ = http(pb, "GET", path + "/schema")
    assert status == 404
    pc.create_producer(topic, schema=pulsar.schema.StringSchema()).close()


def test_bytes_schema_is_refused_over_rest(pb, pc):
    # Pulsar's SchemasResourceBase: BYTES is the default, never a version.
    topic = "persistent://%s/bytes" % new_namespace(pb)
    path = "/admin/v2/schemas/" + topic[len("persistent://"):]
    status, body = http(pb, "POST", path + "/schema", json.dumps({"type": "BYTES", "schema": "", "properties": {}}))
    assert status == 406, (status, body)
    assert "Do not upload a BYTES schema" in json.loads(body)["reason"], body
    status, _ = http(pb, "GET", path + "/schema")
    assert status == 404
    # Nothing was stored: a typed producer is the topic's first schema.
    pc.create_producer(topic, schema=pulsar.schema.StringSchema()).close()
    status, body = http(pb, "GET", path + "/schema")
    assert status == 200 and json.loads(body)["type"] == "STRING", (status, body)


def test_messages_read_back_over_rest(pb, pc):
    topic = "persistent://%s/peek" % new_namespace(pb)
    consumer = pc.subscribe(topic, "sub")
    producer = pc.create_producer(topic, batching_enabled=False)
    ids = [producer.send(b"m%d" % i, properties={"Key": "V%d" % i}) for i in range(3)]
    status, body = http(pb, "GET", rest(topic) + "/subscription/sub/position/2")
    assert status == 200 and body == b"m1", (status, body)
    first = ids[0]
    status, body = http(pb, "GET", rest(topic) + "/ledger/%d/entry/%d" % (first.ledger_id(), first.entry_id()))
    assert status == 200 and body == b"m0", (status, body)
    # Acknowledged entries are skipped by a peek.
    consumer.acknowledge(consumer.receive(timeout_millis=10000))
    wait_until(
        "the ack to reach the broker",
        lambda: (http(pb, "GET", rest(topic) + "/subscription/sub/position/1")[1] == b"m1", None),
    )
    status, body = http(pb, "GET", rest(topic) + "/messageid/0")
    assert json.loads(body)["entryId"] == first.entry_id()
    producer.close()
    consumer.close()


def test_vela_admin_policy_commands(pb, pc):
    import subprocess

    from velaproc import vela_binary

    def admin(*args):
        done = subprocess.run(
            [vela_binary(), "admin", "--admin-url", pb.http_url, *args],
            capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 0, (args, done.stderr)
        return done.stdout.strip()

    topic = "persistent://%s/cli" % new_namespace(pb)
    admin("topics", "create", topic)
    admin("topic-policies", "set", "maxProducers", topic, "1")
    assert admin("topic-policies", "get", "maxProducers", topic) == "1"
    p = pc.create_producer(topic)
    with pytest.raises(pulsar.ProducerBusy):
        pc.create_producer(topic)
    p.close()
    admin("topic-policies", "remove", "maxProducers", topic)
    assert admin("topic-policies", "get", "maxProducers", topic) == ""
    assert "maxProducers" in admin("topic-policies", "list").split()
    admin("topics", "update-properties", topic, "-p", "k=v")
    assert json.loads(admin("topics", "get-properties", topic)) == {"k": "v"}
    assert "leaderBroker" not in admin("brokers", "leader-broker")
    assert json.loads(admin("brokers", "leader-broker"))["brokerId"]


@pytest.mark.parametrize("scope", ["consumer", "subscription"])
def test_unacked_limit_holds_deliveries_until_acks(pb, pc, scope):
    topic = "persistent://%s/unacked" % new_namespace(pb)
    create_topic(pb, topic)
    what = "maxUnackedMessagesOnConsumer" if scope == "consumer" else "maxUnackedMessagesOnSubscription"
    set_topic_policy(pb, topic, what, 3)
    consumer = pc.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    publish(pc, topic, 10, size=10)
    got = [consumer.receive(timeout_millis=10000) for _ in range(3)]
    with pytest.raises(pulsar.Timeout):
        consumer.receive(timeout_millis=1500)
    consumer.acknowledge(got[0])
    assert consumer.receive(timeout_millis=10000).data().startswith(b"000003")
    consumer.close()


def test_schema_validation_enforced_refuses_producers_without_schema(pb, pc):
    ns = new_namespace(pb)
    topic = "persistent://%s/enforced" % ns
    pc.create_producer(topic, schema=pulsar.schema.StringSchema()).close()
    pc.create_producer(topic).close()  # not enforced yet: bytes producers pass
    set_ns_policy(pb, ns, "schemaValidationEnforced", True)
    with pytest.raises(pulsar.IncompatibleSchema):
        pc.create_producer(topic)
    pc.create_producer(topic, schema=pulsar.schema.StringSchema()).close()


def test_namespace_auto_topic_creation(pb, pc):
    ns = new_namespace(pb)
    set_ns_policy(pb, ns, "autoTopicCreation",
                  {"allowAutoTopicCreation": True, "topicType": "partitioned", "defaultNumPartitions": 3})
    topic = "persistent://%s/auto-partitioned" % ns
    pc.create_producer(topic).close()
    status, body = http(pb, "GET", rest(topic) + "/partitions")
    assert status == 200 and json.loads(body)["partitions"] == 3, (status, body)
    set_ns_policy(pb, ns, "autoTopicCreation", {"allowAutoTopicCreation": False})
    with pytest.raises(pulsar.PulsarException):
        pc.create_producer("persistent://%s/never-created" % ns)
    pc.create_producer(topic).close()  # existing topics are unaffected
