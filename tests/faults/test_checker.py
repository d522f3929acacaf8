"""The checker against small made-up histories: each anomaly it claims to
find, it finds; what is allowed (unknown sends present or absent,
redeliveries, rereads) passes."""

import checker


def send(p, v, kind, t=0, mid=None, error=None):
    ops = [{"t": t, "process": p, "type": "invoke", "f": "send", "value": v}]
    done = {"t": t + 5, "process": p, "type": kind, "f": "send", "value": v}
    if mid is not None:
        done["id"] = list(mid)
    if error:
        done["error"] = error
    return ops + [done]


def read(p, v, mid, process="audit", f="read"):
    return {"t": 1000, "process": process, "type": "ok", "f": f, "producer": p, "value": v, "id": list(mid)}


def deliver(p, v, mid):
    return read(p, v, mid, process="c0a", f="receive")


DONE = [{"t": 2000, "process": "workload", "type": "ok", "f": "phase", "value": "done"}]


def found_of(history, events=()):
    found, _, _ = checker.check(history + DONE, list(events))
    return {k: v for k, v in found.items() if v}


def clean_history():
    """p0 sends 0, 1 (ok), 2 (unknown, written), 3 (unknown, not written);
    everything acknowledged is read back and delivered."""
    h = []
    h += send("p0", 0, "ok", mid=(5, 0, -1, -1))
    h += send("p0", 1, "ok", mid=(5, 1, -1, -1))
    h += send("p0", 2, "info", error="Timeout")
    h += send("p0", 3, "info", error="Timeout")
    h += [read("p0", 0, (5, 0, -1, -1)), read("p0", 1, (5, 1, -1, -1)), read("p0", 2, (6, 0, -1, -1))]
    h += [deliver("p0", 0, (5, 0, -1, -1)), deliver("p0", 1, (5, 1, -1, -1)), deliver("p0", 1, (5, 1, -1, -1))]
    return h


def test_a_clean_history_is_valid():
    assert found_of(clean_history()) == {}


def test_a_reread_of_the_same_entry_is_not_a_duplicate():
    h = clean_history() + [read("p0", 1, (5, 1, -1, -1))]
    assert found_of(h) == {}


def test_an_acknowledged_send_missing_is_lost():
    h = [op for op in clean_history() if not (op.get("f") == "read" and op["value"] == 1)]
    assert list(found_of(h)) == ["lost"]


def test_one_value_at_two_entries_is_duplicated():
    h = clean_history() + [read("p0", 2, (6, 1, -1, -1))]
    assert list(found_of(h)) == ["duplicated"]


def test_a_lower_value_after_a_higher_one_is_reordered():
    h = [op for op in clean_history() if op.get("f") != "read"]
    h += [read("p0", 1, (5, 1, -1, -1)), read("p0", 0, (5, 0, -1, -1))]
    # Each value sits at its receipt's entry; only the order is wrong.
    assert list(found_of(h)) == ["reordered"]


def test_a_definitely_failed_send_that_appears_is_unexpected():
    h = clean_history() + send("p0", 4, "fail", error="ProducerQueueIsFull") + [read("p0", 4, (6, 1, -1, -1))]
    assert list(found_of(h)) == ["unexpected"]


def test_a_value_never_sent_is_unexpected():
    h = clean_history() + [read("p0", 9, (6, 1, -1, -1))]
    assert list(found_of(h)) == ["unexpected"]


def test_a_receipt_naming_another_entry_is_misplaced():
    h = clean_history()
    for op in h:
        if op.get("f") == "read" and op["value"] == 1:
            op["id"] = [7, 0, -1, -1]
    assert list(found_of(h)) == ["misplaced"]


def test_an_acknowledged_send_never_delivered_is_lost_from_the_subscription():
    h = [op for op in clean_history() if not (op.get("f") == "receive" and op["value"] == 0)]
    assert list(found_of(h)) == ["lost-from-subscription"]


def test_availability_is_the_longest_time_without_an_acknowledgement():
    h = []
    # p0 acknowledged every 100 ms, except nothing between 1.0 s and 3.5 s.
    for i, t in enumerate([x * 100 for x in range(10)] + [3500 + x * 100 for x in range(10)]):
        h += send("p0", i, "ok", t=t - 5, mid=(1, i, -1, -1))
        h.append(read("p0", i, (1, i, -1, -1)))
        h.append(deliver("p0", i, (1, i, -1, -1)))
    h.append({"t": 0, "process": "p0", "type": "ok", "f": "connect", "value": None, "topic": "persistent://public/e3/x"})
    events = [
        {"t": 1000, "fault": 0, "kind": "pause", "phase": "start", "target": "broker-0", "what": "SIGSTOP"},
        {"t": 3000, "fault": 0, "kind": "pause", "phase": "heal", "target": "broker-0", "what": "HEAL"},
    ]
    found, _, availability = checker.check(h + DONE, events)
    assert not any(found.values())
    assert availability[0]["stall_s"] == 2.5
    assert availability[0]["stall_by_topic"] == {"persistent://public/e3/x": 2.5}
