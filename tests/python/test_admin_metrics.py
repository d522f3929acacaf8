"""The HTTP side of the broker: Pulsar's admin v2 REST API (status codes and
JSON shapes), the HTTP lookup, `/metrics` parsed with the reference
Prometheus text parser, and Vela's write-path breakdown."""

import json
import time
import uuid

import pulsar
from prometheus_client.parser import text_string_to_metric_families

from conftest import http


def _json(broker, method, path, body=None):
    status, raw = http(broker, method, path, body)
    return status, (json.loads(raw) if raw.strip() else None)


def _unique(prefix):
    return prefix + "-" + uuid.uuid4().hex[:8]


def _scrape(broker):
    status, raw = http(broker, "GET", "/metrics")
    assert status == 200, raw
    samples = {}
    for family in text_string_to_metric_families(raw.decode()):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            samples[key] = sample.value
    return samples


def _topic_value(samples, name, topic):
    for (sample, labels), value in samples.items():
        if sample == name and dict(labels).get("topic") == topic and "subscription" not in dict(labels):
            return value
    return None


def test_metrics_parse_and_counters_move(broker, client, topic):
    consumer = client.subscribe(topic, "metrics-sub")
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"warm-up")
    before = _scrape(broker)
    sent = 20
    for i in range(sent):
        producer.send(("m-%d" % i).encode())
    for _ in range(sent + 1):
        consumer.acknowledge(consumer.receive(10_000))
    after = _scrape(broker)

    # Pulsar's topic-level names, labelled with the topic.
    in_before = _topic_value(before, "pulsar_in_messages_total", topic)
    in_after = _topic_value(after, "pulsar_in_messages_total", topic)
    assert in_before is not None and in_after - in_before == sent
    bytes_before = _topic_value(before, "pulsar_in_bytes_total", topic)
    assert _topic_value(after, "pulsar_in_bytes_total", topic) > bytes_before
    assert _topic_value(after, "pulsar_out_messages_total", topic) >= sent
    assert _topic_value(after, "pulsar_storage_size", topic) > 0
    assert _topic_value(after, "pulsar_producers_count", topic) == 1
    for name in ("pulsar_rate_in", "pulsar_rate_out", "pulsar_throughput_in", "pulsar_msg_backlog"):
        assert _topic_value(after, name, topic) is not None, name
    # Storage write latency: Pulsar's le_* buckets add up to the count.
    count = _topic_value(after, "pulsar_storage_write_latency_count", topic)
    assert count >= sent + 1
    buckets = sum(
        value
        for (name, labels), value in after.items()
        if name.startswith("pulsar_storage_write_latency_le_") and dict(labels).get("topic") == topic
    )
    assert buckets == count

    # One histogram per write-path stage, each moving with the publishes.
    def stage_count(samples, stage):
        return sum(
            value
            for (name, labels), value in samples.items()
            if name == "vela_write_path_latency_seconds_count" and dict(labels)["stage"] == stage
        )

    for stage in (
        "broker_publish",
        "ledger_add",
        "bookie_add",
        "journal_queue_wait",
        "journal_write",
        "journal_fdatasync",
    ):
        assert stage_count(after, stage) >= stage_count(before, stage) + 1, stage
    assert stage_count(after, "broker_publish") - stage_count(before, "broker_publish") >= sent
    key = ("pulsar_broker_publish_latency_count", (("cluster", "standalone"),))
    assert after[key] - before[key] >= sent
    producer.close()
    consumer.close()


def test_tenants_and_namespaces(broker):
    tenant = _unique("tenant")
    assert _json(broker, "GET", "/admin/v2/clusters") == (200, ["standalone"])
    body = json.dumps({"adminRoles": [], "allowedClusters": ["standalone"]})
    assert http(broker, "PUT", "/admin/v2/tenants/" + tenant, body)[0] == 204
    assert http(broker, "PUT", "/admin/v2/tenants/" + tenant, body)[0] == 409
    status, doc = _json(broker, "PUT", "/admin/v2/tenants/x" + tenant, json.dumps({"allowedClusters": ["nope"]}))
    assert status == 412 and "reason" in doc
    assert tenant in _json(broker, "GET", "/admin/v2/tenants")[1]
    assert _json(broker, "GET", "/admin/v2/tenants/" + tenant)[1]["allowedClusters"] == ["standalone"]
    assert http(broker, "GET", "/admin/v2/tenants/nope-" + tenant)[0] == 404

    ns = tenant + "/ns"
    assert http(broker, "PUT", "/admin/v2/namespaces/" + ns)[0] == 204
    assert http(broker, "PUT", "/admin/v2/namespaces/" + ns)[0] == 409
    assert http(broker, "PUT", "/admin/v2/namespaces/nope-%s/ns" % tenant)[0] == 404
    assert _json(broker, "GET", "/admin/v2/namespaces/" + tenant)[1] == [ns]
    policies = _json(broker, "GET", "/admin/v2/namespaces/" + ns)[1]
    assert policies["replication_clusters"] == ["standalone"]

    # Policies: persistence, retention, TTL, deduplication, backlog quota.
    base = "/admin/v2/namespaces/" + ns
    assert _json(broker, "GET", base + "/persistence")[1] is None
    persistence = {"bookkeeperEnsemble": 1, "bookkeeperWriteQuorum": 1, "bookkeeperAckQuorum": 1}
    assert http(broker, "POST", base + "/persistence", json.dumps(persistence))[0] == 204
    assert _json(broker, "GET", base + "/persistence")[1]["bookkeeperEnsemble"] == 1
    bad = {"bookkeeperEnsemble": 1, "bookkeeperWriteQuorum": 2, "bookkeeperAckQuorum": 1}
    status, doc = _json(broker, "POST", base + "/persistence", json.dumps(bad))
    assert status == 400 and "Ensemble" in doc["reason"]
    assert http(broker, "POST", base + "/persistence", "{not json")[0] == 400
    retention = {"retentionTimeInMinutes": 60, "retentionSizeInMB": 10}
    assert http(broker, "POST", base + "/retention", json.dumps(retention))[0] == 204
    assert _json(broker, "GET", base + "/retention")[1] == retention
    bad_retention = {"retentionTimeInMinutes": 0, "retentionSizeInMB": 10}
    assert http(broker, "POST", base + "/retention", json.dumps(bad_retention))[0] == 400
    assert http(broker, "POST", base + "/messageTTL", "300")[0] == 204
    assert _json(broker, "GET", base + "/messageTTL")[1] == 300
    assert http(broker, "POST", base + "/messageTTL", "-5")[0] == 412
    assert http(broker, "DELETE", base + "/messageTTL")[0] == 204
    assert _json(broker, "GET", base + "/messageTTL")[1] is None
    assert http(broker, "POST", base + "/deduplication", "true")[0] == 204
    assert _json(broker, "GET", base + "/deduplication")[1] is True
    quota = {"limitSize": 1048576, "limitTime": -1, "policy": "producer_exception"}
    assert http(broker, "POST", base + "/backlogQuota?backlogQuotaType=destination_storage", json.dumps(quota))[0] == 204
    quotas = _json(broker, "GET", base + "/backlogQuotaMap")[1]
    assert quotas["destination_storage"]["limitSize"] == 1048576
    assert quotas["destination_storage"]["policy"] == "producer_exception"
    bad_quota = dict(quota, policy="nope")
    assert http(broker, "POST", base + "/backlogQuota", json.dumps(bad_quota))[0] == 400
    status, body = http(broker, "GET", "/admin/v2/namespaces/%s/missing/persistence" % tenant)
    assert status == 404 and json.loads(body)["reason"].endswith(" does not exist"), (status, body)
    assert "does not exist does not exist" not in json.loads(body)["reason"], body

    # Deletion: refused while not empty, then allowed.
    assert http(broker, "PUT", "/admin/v2/persistent/%s/t" % ns, "{}")[0] == 204
    assert http(broker, "DELETE", base)[0] == 409
    assert http(broker, "DELETE", "/admin/v2/tenants/" + tenant)[0] == 409
    assert http(broker, "DELETE", "/admin/v2/persistent/%s/t" % ns)[0] == 204
    assert http(broker, "DELETE", base)[0] == 204
    assert http(broker, "DELETE", base)[0] == 404
    assert http(broker, "DELETE", "/admin/v2/tenants/" + tenant)[0] == 204
    assert http(broker, "DELETE", "/admin/v2/tenants/" + tenant)[0] == 404


def test_topics_stats_and_lookup(broker, client):
    local = _unique("stats")
    topic = "persistent://public/default/" + local
    path = "/admin/v2/persistent/public/default/" + local
    assert http(broker, "PUT", path, "{}")[0] == 204
    assert http(broker, "PUT", path, "{}")[0] == 409
    assert http(broker, "PUT", path + "/partitions", "2")[0] == 409
    assert topic in _json(broker, "GET", "/admin/v2/persistent/public/default")[1]
    assert _json(broker, "GET", "/admin/v2/non-persistent/public/default")[1] == []
    assert _json(broker, "GET", path + "/partitions")[1] == {"partitions": 0}

    producer = client.create_producer(topic, batching_enabled=False)
    consumer = client.subscribe(topic, "s1")
    for i in range(7):
        producer.send(b"x" * 10)
    stats = _json(broker, "GET", path + "/stats")[1]
    assert stats["msgInCounter"] == 7
    assert stats["bytesInCounter"] > 70
    assert isinstance(stats["publishers"], list) and len(stats["publishers"]) == 1
    assert stats["subscriptions"]["s1"]["type"] == "Exclusive"
    assert len(stats["subscriptions"]["s1"]["consumers"]) == 1
    internal = _json(broker, "GET", path + "/internalStats?metadata=true")[1]
    assert internal["numberOfEntries"] == 7
    assert "ensembleSize=1" in internal["ledgers"][-1]["metadata"]
    assert "s1" in internal["cursors"]

    # Deleting a topic with clients needs force.
    status, doc = _json(broker, "DELETE", path)
    assert status == 412 and doc["reason"] == "Topic has active producers/subscriptions"

    lookup = _json(broker, "GET", "/lookup/v2/topic/persistent/public/default/" + local)[1]
    assert lookup["brokerUrl"] == broker.url
    assert lookup["httpUrl"] == broker.http_url
    assert "brokerUrlTls" in lookup and "brokerUrlSsl" in lookup
    assert http(broker, "GET", "/lookup/v2/topic/persistent/nope/nope/x")[0] == 404

    assert http(broker, "GET", "/admin/v2/persistent/public/default/missing-%s/stats" % local)[0] == 404
    assert http(broker, "GET", path + "/partitioned-stats")[0] == 404
    assert http(broker, "PUT", "/admin/v2/persistent/public/default/p-%s/partitions" % local, "oops")[0] == 400
    assert http(broker, "PUT", "/admin/v2/persistent/public/default/p-%s/partitions" % local, "0")[0] == 412
    producer.close()
    consumer.close()
    assert http(broker, "DELETE", path + "?force=true")[0] == 204
    assert http(broker, "GET", path + "/stats")[0] == 404


def test_partitioned_topic_admin(broker, client):
    local = _unique("part")
    topic = "persistent://public/default/" + local
    path = "/admin/v2/persistent/public/default/" + local
    assert http(broker, "PUT", path + "/partitions", json.dumps({"partitions": 2, "properties": {}}))[0] == 204
    assert _json(broker, "GET", path + "/partitions")[1] == {"partitions": 2}
    assert topic in _json(broker, "GET", "/admin/v2/persistent/public/default/partitioned")[1]
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(6):
        producer.send(b"p", partition_key=str(i))
    producer.close()
    stats = _json(broker, "GET", path + "/partitioned-stats?perPartition=true")[1]
    assert stats["msgInCounter"] == 6
    assert stats["metadata"]["partitions"] == 2
    assert set(stats["partitions"]) == {topic + "-partition-0", topic + "-partition-1"}
    assert http(broker, "POST", path + "/partitions", "3")[0] == 204
    assert http(broker, "POST", path + "/partitions", "1")[0] == 412
    assert http(broker, "DELETE", path + "/partitions")[0] == 204
    assert http(broker, "DELETE", path + "/partitions")[0] == 404


def test_subscription_admin(broker, client):
    local = _unique("subs")
    topic = "persistent://public/default/" + local
    path = "/admin/v2/persistent/public/default/" + local
    producer = client.create_producer(topic, batching_enabled=False)
    start = int(time.time() * 1000)
    ids = [producer.send(("m%d" % i).encode()) for i in range(10)]
    producer.close()

    def backlog(sub):
        return _json(broker, "GET", path + "/stats")[1]["subscriptions"][sub]["msgBacklog"]

    earliest = {"ledgerId": -1, "entryId": -1, "partitionIndex": -1}
    assert http(broker, "PUT", path + "/subscription/admin-sub", json.dumps(earliest))[0] == 204
    assert http(broker, "PUT", path + "/subscription/admin-sub", json.dumps(earliest))[0] == 409
    assert http(broker, "PUT", path + "/subscription/latest-sub")[0] == 204
    assert _json(broker, "GET", path + "/subscriptions")[1] == ["admin-sub", "latest-sub"]
    assert backlog("admin-sub") == 10 and backlog("latest-sub") == 0

    assert http(broker, "POST", path + "/subscription/admin-sub/skip/4")[0] == 204
    assert backlog("admin-sub") == 6
    assert http(broker, "POST", path + "/subscription/admin-sub/skip_all")[0] == 204
    assert backlog("admin-sub") == 0
    assert http(broker, "POST", path + "/subscription/admin-sub/resetcursor/%d" % (start - 1000))[0] == 204
    assert backlog("admin-sub") == 10
    third = ids[3]
    reset = {"ledgerId": third.ledger_id(), "entryId": third.entry_id(), "partitionIndex": -1}
    assert http(broker, "POST", path + "/subscription/admin-sub/resetcursor", json.dumps(reset))[0] == 204
    assert backlog("admin-sub") == 7
    assert http(broker, "POST", path + "/subscription/admin-sub/expireMessages/3600")[0] == 204
    assert backlog("admin-sub") == 7
    assert http(broker, "POST", path + "/subscription/admin-sub/expireMessages/0")[0] == 204
    assert backlog("admin-sub") == 0
    assert http(broker, "POST", path + "/subscription/admin-sub/skip/abc")[0] == 400
    status, body = http(broker, "POST", path + "/subscription/missing/skip/1")
    assert (status, json.loads(body)["reason"]) == (404, "Subscription missing not found for topic " + topic)

    # A live consumer follows a reset (it is disconnected and re-attaches).
    consumer = client.subscribe(topic, "admin-sub")
    assert http(broker, "POST", path + "/subscription/admin-sub/resetcursor/%d" % (start - 1000))[0] == 204
    got = [consumer.receive(10_000).data() for _ in range(10)]
    assert got == [("m%d" % i).encode() for i in range(10)]
    assert http(broker, "DELETE", path + "/subscription/admin-sub")[0] == 412
    consumer.close()
    assert http(broker, "DELETE", path + "/subscription/admin-sub")[0] == 204
    assert http(broker, "DELETE", path + "/subscription/admin-sub")[0] == 404
    assert http(broker, "POST", path + "/all_subscription/expireMessages/0")[0] == 204


def test_write_path_breakdown(broker, client, topic):
    producer = client.create_producer(topic, batching_enabled=False)
    for _ in range(5):
        producer.send(b"w")
    producer.close()
    doc = _json(broker, "GET", "/admin/v2/vela/write-path?topic=" + topic)[1]
    stages = {(row["stage"], row["scope"]) for row in doc["stages"]}
    assert ("broker_publish", "topic") in stages and ("storage_write", "topic") in stages
    for stage in ("ledger_add", "bookie_add", "journal_queue_wait", "journal_write", "journal_fdatasync"):
        assert any(s == stage for s, _ in stages), stage
    for row in doc["stages"]:
        assert len(row["buckets"]) == len(doc["bucket_bounds_us"]) + 1
        assert row["p50_us"] <= row["p99_us"] <= row["p999_us"] <= row["max_us"] or row["count"] == 0
    topic_row = next(r for r in doc["stages"] if r["stage"] == "broker_publish" and r["scope"] == "topic")
    assert topic_row["count"] == 5


def test_persistence_policy_reaches_the_next_ledger():
    """A loaded topic gets a namespace's new persistence at its next ledger."""
    from conftest import start_broker, stop_broker

    b = start_broker(["--bookies", "2", "--ensemble-size", "1"])
    try:
        c = pulsar.Client(b.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
        topic = "persistent://public/default/" + _unique("persist")
        path = "/admin/v2/persistent/public/default/" + topic.rsplit("/", 1)[1]
        producer = c.create_producer(topic)
        producer.send(b"one")
        meta = _json(b, "GET", path + "/internalStats?metadata=true")[1]["ledgers"][-1]["metadata"]
        assert "ensembleSize=1" in meta
        persistence = {"bookkeeperEnsemble": 2, "bookkeeperWriteQuorum": 2, "bookkeeperAckQuorum": 2}
        assert http(b, "POST", "/admin/v2/namespaces/public/default/persistence", json.dumps(persistence))[0] == 204
        # The open ledger keeps E=1; the next one (after an unload) is on 2 bookies.
        assert http(b, "PUT", path + "/unload")[0] == 204
        producer.send(b"two")
        ledgers = _json(b, "GET", path + "/internalStats?metadata=true")[1]["ledgers"]
        assert "ensembleSize=2" in ledgers[-1]["metadata"]
        assert "writeQuorumSize=2" in ledgers[-1]["metadata"]
        c.close()
    finally:
        stop_broker(b)
