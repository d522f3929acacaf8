package vela;

import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.admin.PulsarAdmin;
import org.apache.pulsar.client.admin.PulsarAdminException;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.common.policies.data.BacklogQuota;
import org.apache.pulsar.common.policies.data.PartitionedTopicStats;
import org.apache.pulsar.common.policies.data.PersistencePolicies;
import org.apache.pulsar.common.policies.data.PersistentTopicInternalStats;
import org.apache.pulsar.common.policies.data.RetentionPolicies;
import org.apache.pulsar.common.policies.data.TenantInfo;
import org.apache.pulsar.common.policies.data.TopicStats;

/**
 * The official Java admin client against a running `vela standalone --bookies 2
 * --ensemble-size 1`: tenants, namespaces and policies, a partitioned topic whose
 * namespace persistence is raised to E=2/Qw=2/Qa=2 (the next ledger must be on two
 * bookies), stats after a produce, subscriptions; topic-level policies, properties,
 * schemas and message reads (`PolicyCheck`). Exits non-zero on the first
 * failed check. Args: HTTP URL, Pulsar URL.
 */
public final class AdminCheck {
    private static int checks = 0;

    private static void check(boolean ok, String what) {
        checks++;
        if (!ok) {
            throw new AssertionError("check failed: " + what);
        }
        System.out.println("ok   " + what);
    }

    private static <T extends Throwable> void expect(Class<T> kind, String what, ThrowingRunnable r)
            throws Exception {
        try {
            r.run();
        } catch (Throwable t) {
            check(kind.isInstance(t), what + " -> " + t.getClass().getSimpleName());
            return;
        }
        check(false, what + " -> no error");
    }

    interface ThrowingRunnable {
        void run() throws Exception;
    }

    /** Ensemble size and distinct bookies of a ledger, from BookKeeper's metadata text. */
    private static int[] ensembleOf(String metadata) {
        int size = Integer.parseInt(metadata.replaceAll(".*ensembleSize=(\\d+).*", "$1"));
        String bookies = metadata.replaceAll(".*ensembles=\\{0=\\[([^\\]]*)\\].*", "$1");
        int distinct = (int) java.util.Arrays.stream(bookies.split(","))
                .map(String::trim).filter(s -> !s.isEmpty()).distinct().count();
        return new int[] {size, distinct};
    }

    public static void main(String[] args) throws Exception {
        String httpUrl = args[0];
        String serviceUrl = args[1];
        String tenant = "java-admin";
        String ns = tenant + "/ns";
        String topic = "persistent://" + ns + "/t";
        String partition = topic + "-partition-0";

        try (PulsarAdmin admin = PulsarAdmin.builder().serviceHttpUrl(httpUrl).build()) {
            check(admin.clusters().getClusters().contains("standalone"), "clusters list");
            admin.tenants().createTenant(tenant,
                    TenantInfo.builder().allowedClusters(Set.of("standalone")).build());
            check(admin.tenants().getTenants().contains(tenant), "tenant created and listed");
            check(admin.tenants().getTenantInfo(tenant).getAllowedClusters().contains("standalone"),
                    "tenant info");
            expect(PulsarAdminException.ConflictException.class, "create tenant twice",
                    () -> admin.tenants().createTenant(tenant,
                            TenantInfo.builder().allowedClusters(Set.of("standalone")).build()));
            expect(PulsarAdminException.PreconditionFailedException.class, "unknown cluster",
                    () -> admin.tenants().createTenant("other",
                            TenantInfo.builder().allowedClusters(Set.of("nope")).build()));

            admin.namespaces().createNamespace(ns);
            check(admin.namespaces().getNamespaces(tenant).contains(ns), "namespace created");
            expect(PulsarAdminException.ConflictException.class, "create namespace twice",
                    () -> admin.namespaces().createNamespace(ns));
            check(admin.namespaces().getPersistence(ns) == null, "no persistence policy yet");

            admin.topics().createPartitionedTopic(topic, 1);
            check(admin.topics().getPartitionedTopicMetadata(topic).partitions == 1,
                    "partitioned topic with 1 partition");
            check(admin.topics().getList(ns).contains(partition), "topics list has the partition");
            check(admin.topics().getPartitionedTopicList(ns).contains(topic),
                    "partitioned topics list");
            expect(PulsarAdminException.ConflictException.class, "create partitioned topic twice",
                    () -> admin.topics().createPartitionedTopic(topic, 1));

            try (PulsarClient client = PulsarClient.builder().serviceUrl(serviceUrl)
                    .operationTimeout(30, TimeUnit.SECONDS).build()) {
                try (Consumer<byte[]> consumer = client.newConsumer().topic(topic)
                        .subscriptionName("java-sub")
                        .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                        .subscribe()) {
                    // The subscription exists; consumer closed before producing.
                }
                try (Producer<byte[]> producer = client.newProducer().topic(topic)
                        .enableBatching(false).create()) {
                    for (int i = 0; i < 5; i++) {
                        producer.send(("before-" + i).getBytes());
                    }
                }
                PersistentTopicInternalStats before = admin.topics().getInternalStats(partition, true);
                String firstMetadata = before.ledgers.get(before.ledgers.size() - 1).metadata;
                check(firstMetadata != null && ensembleOf(firstMetadata)[0] == 1,
                        "ledger before set-persistence has ensemble 1: " + firstMetadata);

                admin.namespaces().setPersistence(ns, new PersistencePolicies(2, 2, 2, 0.0));
                PersistencePolicies p = admin.namespaces().getPersistence(ns);
                check(p.getBookkeeperEnsemble() == 2 && p.getBookkeeperWriteQuorum() == 2
                        && p.getBookkeeperAckQuorum() == 2, "persistence 2/2/2 read back");
                expect(PulsarAdminException.class, "persistence E < Qw refused",
                        () -> admin.namespaces().setPersistence(ns,
                                new PersistencePolicies(1, 2, 1, 0.0)));

                // The open ledger keeps its replication; the next one gets the policy.
                admin.topics().unload(topic);
                try (Producer<byte[]> producer = client.newProducer().topic(topic)
                        .enableBatching(false).create()) {
                    for (int i = 0; i < 5; i++) {
                        producer.send(("after-" + i).getBytes());
                    }
                }
            }

            PersistentTopicInternalStats internal = admin.topics().getInternalStats(partition, true);
            String lastMetadata = internal.ledgers.get(internal.ledgers.size() - 1).metadata;
            int[] ensemble = ensembleOf(lastMetadata);
            check(ensemble[0] == 2 && ensemble[1] == 2,
                    "new ledger uses 2 bookies (E=2, Qw=2, Qa=2): " + lastMetadata);
            check(lastMetadata.contains("writeQuorumSize=2") && lastMetadata.contains("ackQuorumSize=2"),
                    "new ledger quorums are 2/2");
            check(internal.numberOfEntries == 10, "internal stats: 10 entries, got " + internal.numberOfEntries);
            check(internal.cursors.containsKey("java-sub"), "internal stats lists the cursor");

            TopicStats stats = admin.topics().getStats(partition);
            check(stats.getMsgInCounter() == 5,
                    "partition stats: 5 messages in since the reload, got " + stats.getMsgInCounter());
            check(stats.getBytesInCounter() > 0, "partition stats: bytes in");
            check(stats.getSubscriptions().get("java-sub").getMsgBacklog() == 10,
                    "subscription backlog 10, got "
                            + stats.getSubscriptions().get("java-sub").getMsgBacklog());
            check(stats.getStorageSize() > 0, "storage size");
            PartitionedTopicStats pstats = admin.topics().getPartitionedStats(topic, true);
            check(pstats.getMsgInCounter() == 5, "partitioned stats aggregate");
            check(pstats.getMetadata().partitions == 1, "partitioned stats metadata");
            check(pstats.getPartitions().containsKey(partition), "partitioned stats per partition");

            List<String> subs = admin.topics().getSubscriptions(topic);
            check(subs.contains("java-sub"), "subscriptions list");
            admin.topics().skipMessages(partition, "java-sub", 3);
            check(admin.topics().getStats(partition).getSubscriptions().get("java-sub").getMsgBacklog() == 7,
                    "skip 3 -> backlog 7");
            admin.topics().resetCursor(topic, "java-sub", 0L);
            check(admin.topics().getStats(partition).getSubscriptions().get("java-sub").getMsgBacklog() == 10,
                    "reset cursor to time 0 -> backlog 10");
            admin.topics().expireMessages(partition, "java-sub", 0);
            check(admin.topics().getStats(partition).getSubscriptions().get("java-sub").getMsgBacklog() == 0,
                    "expire messages older than 0 s -> backlog 0");
            admin.topics().createSubscription(topic, "created", org.apache.pulsar.client.api.MessageId.earliest);
            check(admin.topics().getStats(partition).getSubscriptions().get("created").getMsgBacklog() == 10,
                    "created subscription at earliest has backlog 10");
            expect(PulsarAdminException.ConflictException.class, "create subscription twice",
                    () -> admin.topics().createSubscription(topic, "created",
                            org.apache.pulsar.client.api.MessageId.latest));
            admin.topics().deleteSubscription(topic, "created");
            check(!admin.topics().getSubscriptions(topic).contains("created"), "subscription deleted");
            expect(PulsarAdminException.NotFoundException.class, "delete missing subscription",
                    () -> admin.topics().deleteSubscription(topic, "created"));

            admin.namespaces().setRetention(ns, new RetentionPolicies(60, 100));
            RetentionPolicies r = admin.namespaces().getRetention(ns);
            check(r.getRetentionTimeInMinutes() == 60 && r.getRetentionSizeInMB() == 100, "retention");
            admin.namespaces().setNamespaceMessageTTL(ns, 120);
            check(admin.namespaces().getNamespaceMessageTTL(ns) == 120, "message TTL");
            admin.namespaces().setDeduplicationStatus(ns, true);
            check(Boolean.TRUE.equals(admin.namespaces().getDeduplicationStatus(ns)), "deduplication");
            admin.namespaces().setBacklogQuota(ns, BacklogQuota.builder().limitSize(1 << 20)
                    .retentionPolicy(BacklogQuota.RetentionPolicy.producer_exception).build());
            Map<BacklogQuota.BacklogQuotaType, BacklogQuota> quotas = admin.namespaces().getBacklogQuotaMap(ns);
            BacklogQuota quota = quotas.get(BacklogQuota.BacklogQuotaType.destination_storage);
            check(quota != null && quota.getLimitSize() == (1 << 20)
                    && quota.getPolicy() == BacklogQuota.RetentionPolicy.producer_exception, "backlog quota");

            PolicyCheck.run(admin, serviceUrl, ns, AdminCheck::check);

            expect(PulsarAdminException.NotFoundException.class, "stats of a missing topic",
                    () -> admin.topics().getStats("persistent://" + ns + "/missing"));
            expect(PulsarAdminException.ConflictException.class, "delete non-empty namespace",
                    () -> admin.namespaces().deleteNamespace(ns));
            expect(PulsarAdminException.ConflictException.class, "delete tenant with namespaces",
                    () -> admin.tenants().deleteTenant(tenant));

            admin.topics().deletePartitionedTopic(topic, true);
            admin.namespaces().deleteNamespace(ns);
            admin.tenants().deleteTenant(tenant);
            check(!admin.tenants().getTenants().contains(tenant), "cleanup: tenant deleted");
        }
        System.out.println("java admin: " + checks + " checks passed");
        System.exit(0);
    }
}
