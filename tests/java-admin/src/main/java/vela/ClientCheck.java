package vela;

import java.util.List;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.admin.PulsarAdmin;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.PulsarClientException;
import org.apache.pulsar.client.api.Reader;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.impl.MultiTopicsConsumerImpl;

/**
 * The official Java client on what only it implements among the official
 * clients: topic list watchers (a pattern consumer told of new and deleted
 * topics by WATCH_TOPIC_UPDATE; its auto-discovery poll is set to a minute,
 * so only the watcher explains seeing them sooner) and the end of a
 * terminated topic (REACHED_END_OF_TOPIC: hasReachedEndOfTopic on a
 * consumer and a reader). Timing is only asserted as "before the poll".
 * Exits non-zero on the first failed check. Args: HTTP URL, Pulsar URL.
 */
public final class ClientCheck {
    /** The pattern consumer's own poll: a topic seen sooner came by the watcher. */
    private static final int POLL_PERIOD_S = 60;

    private static void check(boolean ok, String what) {
        if (!ok) {
            throw new AssertionError("check failed: " + what);
        }
        System.out.println("ok   " + what);
    }

    /** Waits until `condition` holds, at most `seconds`; the time it took in ms, -1 if never. */
    private static long within(int seconds, java.util.function.BooleanSupplier condition) throws Exception {
        long start = System.nanoTime();
        long deadline = start + TimeUnit.SECONDS.toNanos(seconds);
        while (System.nanoTime() < deadline) {
            if (condition.getAsBoolean()) {
                return TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start);
            }
            Thread.sleep(20);
        }
        return -1;
    }

    public static void main(String[] args) throws Exception {
        String httpUrl = args[0];
        String pulsarUrl = args[1];
        String run = Long.toHexString(System.nanoTime());
        try (PulsarAdmin admin = PulsarAdmin.builder().serviceHttpUrl(httpUrl).build();
                PulsarClient client = PulsarClient.builder().serviceUrl(pulsarUrl).build()) {
            watchers(admin, client, run);
            endOfTopic(admin, client, run);
        }
        System.out.println("all checks passed");
    }

    private static void watchers(PulsarAdmin admin, PulsarClient client, String run) throws Exception {
        String prefix = "persistent://public/default/jw-" + run;
        String first = prefix + "-first";
        admin.topics().createNonPartitionedTopic(first);
        Consumer<byte[]> consumer = client.newConsumer()
                .topicsPattern(prefix + "-.*")
                .subscriptionName("watch")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                .patternAutoDiscoveryPeriod(POLL_PERIOD_S, TimeUnit.SECONDS)
                .subscribe();
        @SuppressWarnings("unchecked")
        MultiTopicsConsumerImpl<byte[]> multi = (MultiTopicsConsumerImpl<byte[]>) consumer;
        check(multi.getPartitions().contains(first), "the pattern consumer starts on the existing topic");

        // A topic made by a producer (auto-creation): its message arrives.
        String created = prefix + "-created";
        long start = System.nanoTime();
        try (Producer<byte[]> producer = client.newProducer().topic(created).create()) {
            producer.send("hello".getBytes());
        }
        Message<byte[]> message = consumer.receive(POLL_PERIOD_S / 2, TimeUnit.SECONDS);
        long tookMs = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start);
        check(message != null && new String(message.getValue()).equals("hello"),
                "a new topic's message arrives before the poll period (" + tookMs + " ms)");
        consumer.acknowledge(message);

        // A partitioned topic: every partition is picked up.
        String partitioned = prefix + "-parts";
        admin.topics().createPartitionedTopic(partitioned, 2);
        long seen = within(POLL_PERIOD_S / 2, () -> multi.getPartitions().contains(partitioned + "-partition-1"));
        check(seen >= 0, "a new partitioned topic is seen before the poll period (" + seen + " ms)");

        // A deleted topic is dropped.
        admin.topics().delete(first, true);
        long gone = within(POLL_PERIOD_S / 2, () -> !multi.getPartitions().contains(first));
        check(gone >= 0, "a deleted topic is dropped before the poll period (" + gone + " ms)");
        consumer.close();
    }

    private static void endOfTopic(PulsarAdmin admin, PulsarClient client, String run) throws Exception {
        String topic = "persistent://public/default/jend-" + run;
        Producer<byte[]> producer = client.newProducer().topic(topic).enableBatching(false).create();
        Consumer<byte[]> consumer = client.newConsumer().topic(topic).subscriptionName("end")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest).subscribe();
        for (int i = 0; i < 3; i++) {
            producer.send(("m" + i).getBytes());
        }
        MessageId last = admin.topics().terminateTopicAsync(topic).get();
        check(last != null, "terminate answers the last message id " + last);
        try {
            producer.send("too late".getBytes());
            check(false, "a send after termination fails");
        } catch (PulsarClientException.TopicTerminatedException e) {
            check(true, "a send after termination fails with TopicTerminatedException");
        }
        try {
            client.newProducer().topic(topic).create();
            check(false, "a new producer is refused");
        } catch (PulsarClientException.TopicTerminatedException e) {
            check(true, "a new producer is refused with TopicTerminatedException");
        }
        check(!consumer.hasReachedEndOfTopic(), "not at the end while messages are unread");
        for (int i = 0; i < 3; i++) {
            consumer.acknowledge(consumer.receive(10, TimeUnit.SECONDS));
        }
        check(within(10, consumer::hasReachedEndOfTopic) >= 0, "the consumer reaches the end of the topic");

        Reader<byte[]> reader = client.newReader().topic(topic).startMessageId(MessageId.earliest).create();
        int read = 0;
        while (reader.hasMessageAvailable()) {
            reader.readNext(10, TimeUnit.SECONDS);
            read++;
        }
        check(read == 3, "the reader reads the 3 messages (" + read + ")");
        check(within(10, reader::hasReachedEndOfTopic) >= 0, "the reader reaches the end of the topic");
        reader.close();
        consumer.close();
        List<String> subscriptions = admin.topics().getSubscriptions(topic);
        check(subscriptions.contains("end"), "the subscription is kept");
    }
}
