"""Several producers (batching on and off) and consumers on two client
connections at once: every message arrives, Key_Shared keeps per-key order
even when a consumer joins mid-stream, nacked messages come back."""

import threading
import time
from collections import defaultdict

import pulsar

N = 4000


def test_many_producers_and_consumers(broker, topic):
    clients = [
        pulsar.Client(broker.url, operation_timeout_seconds=10, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        for _ in range(2)
    ]
    try:
        shared = [
            clients[i % 2].subscribe(
                topic,
                "shared",
                consumer_type=pulsar.ConsumerType.Shared,
                receiver_queue_size=50,
                negative_ack_redelivery_delay_ms=100,
            )
            for i in range(3)
        ]
        keyed = [
            clients[i % 2].subscribe(topic, "keyed", consumer_type=pulsar.ConsumerType.KeyShared, receiver_queue_size=50)
            for i in range(2)
        ]
        lock = threading.Lock()
        shared_got = set()
        per_key = defaultdict(list)
        owner = {}
        moved = set()

        def consume_shared(consumer):
            while True:
                try:
                    msg = consumer.receive(timeout_millis=2000)
                except pulsar.Timeout:
                    return
                if msg.redelivery_count() == 0 and hash(msg.data()) % 5 == 0:
                    consumer.negative_acknowledge(msg)
                    continue
                with lock:
                    shared_got.add(msg.data())
                consumer.acknowledge(msg)

        def consume_keyed(index, consumer):
            while True:
                try:
                    msg = consumer.receive(timeout_millis=2000)
                except pulsar.Timeout:
                    return
                producer_index, seq = msg.data().split(b"-")
                with lock:
                    key = msg.partition_key()
                    if owner.setdefault(key, index) != index:
                        moved.add(key)
                        owner[key] = index
                    per_key[(key, producer_index)].append(int(seq))
                consumer.acknowledge(msg)

        threads = [threading.Thread(target=consume_shared, args=(c,)) for c in shared]
        threads += [threading.Thread(target=consume_keyed, args=(i, c)) for i, c in enumerate(keyed)]
        for t in threads:
            t.start()

        def produce(index):
            producer = clients[index % 2].create_producer(
                topic,
                batching_enabled=bool(index % 2),
                batching_type=pulsar.BatchingType.KeyBased,
                batching_max_publish_delay_ms=2,
                block_if_queue_full=True,
            )
            for seq in range(N // 4):
                producer.send_async(b"%d-%d" % (index, seq), None, partition_key="k%d" % (seq % 20))
            producer.flush()

        producers = [threading.Thread(target=produce, args=(i,)) for i in range(4)]
        for t in producers:
            t.start()
        time.sleep(0.1)
        late = clients[0].subscribe(topic, "keyed", consumer_type=pulsar.ConsumerType.KeyShared, receiver_queue_size=50)
        late_thread = threading.Thread(target=consume_keyed, args=(2, late))
        late_thread.start()
        for t in producers + threads + [late_thread]:
            t.join(60)
        assert len(shared_got) == N
        assert sum(len(v) for v in per_key.values()) == N
        for key, seqs in per_key.items():
            assert seqs == sorted(seqs), "key %s out of order" % (key,)
    finally:
        for c in clients:
            c.close()
