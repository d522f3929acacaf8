"""Schema compatibility as Pulsar checks it, with the official client:
Avro and JSON schemas evolve under the topic's strategy (FULL by default,
the namespace's or the topic's `schemaCompatibilityStrategy` otherwise), an
incompatible producer schema is refused with IncompatibleSchema, a consumer
whose schema cannot read the topic's latest schema is refused, and the
strategy's admin routes answer as Pulsar's (namespace GET/PUT, topic
GET/PUT/DELETE with `?applied`)."""

import json
import uuid

import pulsar
import pytest
from pulsar.schema import AvroSchema, Integer, JsonSchema, Record, String, StringSchema

from conftest import http


class UserV1(Record):
    name = String()
    age = Integer()


class UserV2(Record):
    # age no longer optional: V2 cannot read V1's null ages (not BACKWARD),
    # V1 reads V2's ints (FORWARD).
    name = String()
    age = Integer(required=True)


class Point(Record):
    x = Integer()
    y = Integer()


class TextPoint(Record):
    x = String()
    y = Integer()


def new_namespace(broker):
    ns = "public/schema-" + uuid.uuid4().hex[:8]
    status, body = http(broker, "PUT", "/admin/v2/namespaces/" + ns)
    assert status == 204, (status, body)
    return ns


def strategy_path(ns):
    return "/admin/v2/namespaces/%s/schemaCompatibilityStrategy" % ns


def test_default_full_refuses_a_forward_only_change_and_forward_takes_it(broker, client):
    ns = new_namespace(broker)
    topic = "persistent://%s/users" % ns
    client.create_producer(topic, schema=AvroSchema(UserV1)).close()
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic, schema=AvroSchema(UserV2))
    # Unset, the namespace's own strategy reads UNDEFINED (the broker's
    # FULL applies), as Pulsar 4.0 answers it.
    status, body = http(broker, "GET", strategy_path(ns))
    assert status == 200 and json.loads(body) == "UNDEFINED"
    assert http(broker, "PUT", strategy_path(ns), '"FORWARD"')[0] == 204
    assert json.loads(http(broker, "GET", strategy_path(ns))[1]) == "FORWARD"
    v1 = client.create_producer(topic, schema=AvroSchema(UserV1))
    v2 = client.create_producer(topic, schema=AvroSchema(UserV2))
    reader = client.create_reader(topic, pulsar.MessageId.earliest, schema=AvroSchema(UserV1))
    v1.send(UserV1(name="a", age=1))
    v2.send(UserV2(name="b", age=2))
    assert [(m.value().name, m.value().age) for m in (reader.read_next(5000), reader.read_next(5000))] == [
        ("a", 1), ("b", 2)]


def test_a_consumer_schema_that_cannot_read_the_topic_is_refused(broker, client):
    topic = "persistent://public/default/points-" + uuid.uuid4().hex[:8]
    producer = client.create_producer(topic, schema=JsonSchema(Point))
    for refused in (JsonSchema(TextPoint), StringSchema(), AvroSchema(Point)):
        with pytest.raises(pulsar.IncompatibleSchema):
            client.subscribe(topic, "s", schema=refused)
    consumer = client.subscribe(topic, "s", schema=JsonSchema(Point))
    producer.send(Point(x=1, y=2))
    value = consumer.receive(5000).value()
    assert (value.x, value.y) == (1, 2)


def test_topic_level_strategy_routes(broker, client):
    ns = new_namespace(broker)
    topic = "persistent://%s/t" % ns
    path = "/admin/v2/persistent/%s/t/schemaCompatibilityStrategy" % ns
    status, body = http(broker, "GET", path)
    assert status == 200 and json.loads(body) is None
    assert json.loads(http(broker, "GET", path + "?applied=true")[1]) == "FULL"
    assert http(broker, "PUT", strategy_path(ns), '"BACKWARD"')[0] == 204
    assert json.loads(http(broker, "GET", path + "?applied=true")[1]) == "BACKWARD"
    assert http(broker, "PUT", path, '"ALWAYS_INCOMPATIBLE"')[0] == 204
    assert json.loads(http(broker, "GET", path)[1]) == "ALWAYS_INCOMPATIBLE"
    client.create_producer(topic, schema=AvroSchema(UserV1)).close()
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic, schema=AvroSchema(Point))
    # The same schema again is no new schema.
    client.create_producer(topic, schema=AvroSchema(UserV1)).close()
    assert http(broker, "DELETE", path)[0] == 204
    assert json.loads(http(broker, "GET", path)[1]) is None
    assert http(broker, "PUT", path, '"SOMETIMES"')[0] == 400
    assert http(broker, "PUT", strategy_path("public/nope"), '"FULL"')[0] == 404
    status, body = http(broker, "PUT", strategy_path("nope/nope"), '"FULL"')
    assert status == 404 and json.loads(body)["reason"] == "Tenant does not exist", (status, body)
    assert http(broker, "PUT", strategy_path(ns), '"UNDEFINED"')[0] == 204
    assert json.loads(http(broker, "GET", strategy_path(ns))[1]) == "UNDEFINED"
