"""Regression tests for bugs the fault schedules found, each reduced to the
smallest real cluster that shows it (tests/cluster/harness.py)."""

import json
import os
import sys
import time
import uuid

import pulsar

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
sys.path.insert(0, os.path.join(HERE, "..", "support"))

from harness import Cluster  # noqa: E402
from pulsarframes import (  # noqa: E402
    base_command,
    field_varint,
    open_connection,
    producer_frame,
    read_command,
    send_frame,
    simple_frame,
)


def set_persistence(cluster, ns, e, qw, qa):
    status, body = cluster.http("PUT", "/admin/v2/namespaces/public/%s" % ns)
    assert status in (204, 409), (status, body)
    persistence = {"bookkeeperEnsemble": e, "bookkeeperWriteQuorum": qw, "bookkeeperAckQuorum": qa}
    status, body = cluster.http("POST", "/admin/v2/namespaces/public/%s/persistence" % ns, json.dumps(persistence))
    assert status == 204, (status, body)


PRODUCER_SUCCESS, SEND_RECEIPT, ERROR, SUCCESS, CLOSE_PRODUCER, PING, PONG = 17, 7, 14, 13, 15, 18, 19


def read_answer(sock):
    """The next command that is not the broker's keep-alive PING (answered)."""
    while True:
        cmd, body = read_command(sock)
        if cmd != PING:
            return cmd, body
        sock.sendall(simple_frame(base_command(PONG, PONG, b"")))


def test_a_topic_stuck_in_recovery_does_not_stall_other_topics_on_the_connection():
    """Found by seed 2002 (--kinds kill9): when a topic's log fails (here: a
    bookie gone from an E=3 ledger on a 3-bookie cluster), the client asks
    for the producer again and the broker reopens the topic, recovering its
    ledger, which waits on the unreachable bookies. The broker did that
    inside the connection's read loop, and the C++ and Java clients put every
    producer and consumer on one connection per broker: every other topic of
    the client (an E=2 topic with a spare bookie, fine on its own) stalled
    with it, 6 to 8 s in the schedules.

    Here, on one connection to a restarted broker: PRODUCER for a topic whose
    ledger recovery waits on two frozen bookies, then PRODUCER and SEND for a
    topic on the third bookie. The second topic's answers must not wait for
    the first's."""
    c = Cluster(bookies=3, brokers=1)
    frozen = []
    sock = None
    try:
        set_persistence(c, "hol3", 3, 3, 2)
        set_persistence(c, "hol1", 1, 1, 1)
        stuck = "persistent://public/hol3/t-" + uuid.uuid4().hex[:6]
        fine = "persistent://public/hol1/t-" + uuid.uuid4().hex[:6]
        client = pulsar.Client(
            c.service_url(), operation_timeout_seconds=30, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
        )
        client.create_producer(stuck, batching_enabled=False).send(b"before")
        client.create_producer(fine, batching_enabled=False).send(b"before")
        client.close()

        # The E=1 ledger's bookie stays; the other two freeze.
        status, out = c.ledgers("list")
        assert status == 0, out
        single = [line.split("ensembles=")[1] for line in out.splitlines() if "ensembles=" in line and "," not in line.split("ensembles=")[1]]
        assert len(single) == 1, out
        keep = single[0].split("[")[1].split("]")[0]
        # The broker dies with both ledgers open: serving a topic again
        # means recovering its ledger, fencing a quorum of its bookies.
        c.brokers[0].kill9()
        frozen = [b for b in c.bookies if b.name != keep]
        for b in frozen:
            b.freeze()
        time.sleep(3.0)  # the dead broker's session (2 s) ends: its bundles are free
        c.brokers[0].start()

        host, port = c.url_of(c.brokers[0], "pulsar")[len("pulsar://"):].split(":")
        sock = open_connection(host, int(port), timeout=60)
        asked = time.time()
        sock.sendall(producer_frame(stuck, 1, 1))
        sock.sendall(producer_frame(fine, 2, 2))
        answers = []
        while True:
            cmd, body = read_answer(sock)
            answers.append((cmd, body.get(1, [None])[0]))
            print("t=%.2fs answer %s" % (time.time() - asked, answers[-1]))
            if cmd == PRODUCER_SUCCESS and body.get(1) == [2]:
                sock.sendall(send_frame(2, 0, b"during"))
            if cmd == SEND_RECEIPT or (cmd in (PRODUCER_SUCCESS, ERROR) and body.get(1) == [1]):
                break
        # Before the fix: [(ERROR or PRODUCER_SUCCESS, 1)] after the recovery
        # gave up or the bookies came back, the other topic's answers after it.
        assert answers[:2] == [(PRODUCER_SUCCESS, 2), (SEND_RECEIPT, 2)], answers

        # The client gives up on the waiting producer: closing it is answered
        # at once, and once the topic opens the producer is not created
        # after all (its PRODUCER gets an error, not a success).
        sock.sendall(simple_frame(base_command(CLOSE_PRODUCER, CLOSE_PRODUCER, field_varint(1, 1) + field_varint(2, 3))))
        cmd, body = read_answer(sock)
        print("t=%.2fs close answered %s" % (time.time() - asked, cmd))
        assert (cmd, body.get(1)) == (SUCCESS, [3]), (cmd, body)
        for b in frozen:
            b.thaw()
        cmd, body = read_answer(sock)
        assert (cmd, body.get(1)) == (ERROR, [1]), (cmd, body)
    finally:
        for b in frozen:
            b.thaw()
        if sock is not None:
            sock.close()
        c.close()
