package vela;

import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.admin.PulsarAdmin;
import org.apache.pulsar.client.admin.PulsarAdminException;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.PulsarClientException;
import org.apache.pulsar.client.api.Schema;
import org.apache.pulsar.client.impl.MessageIdImpl;
import org.apache.pulsar.common.policies.data.PersistencePolicies;
import org.apache.pulsar.common.policies.data.RetentionPolicies;
import org.apache.pulsar.common.schema.SchemaInfo;
import org.apache.pulsar.common.schema.SchemaType;

/**
 * Topic-level policies, topic properties, schemas and message reads with the
 * Java admin client: each value read back, and the limits seen by a client
 * (a second producer refused by the topic's maxProducers, a producer of
 * another schema type refused by the schema posted over REST).
 */
final class PolicyCheck {
    private PolicyCheck() {}

    interface Check {
        void check(boolean ok, String what);
    }

    static void run(PulsarAdmin admin, String serviceUrl, String ns, Check c) throws Exception {
        String topic = "persistent://" + ns + "/policies";
        admin.topics().createNonPartitionedTopic(topic, Map.of("owner", "java"));
        c.check("java".equals(admin.topics().getProperties(topic).get("owner")),
                "topic created with properties");
        admin.topics().updateProperties(topic, Map.of("team", "vela"));
        Map<String, String> props = admin.topics().getProperties(topic);
        c.check(props.size() == 2 && "vela".equals(props.get("team")), "topic properties merged");

        c.check(admin.topicPolicies().getMaxProducers(topic) == null, "no topic maxProducers yet");
        admin.topicPolicies().setMaxProducers(topic, 1);
        c.check(Integer.valueOf(1).equals(admin.topicPolicies().getMaxProducers(topic)),
                "topic maxProducers read back");
        admin.topicPolicies().setMessageTTL(topic, 300);
        c.check(Integer.valueOf(300).equals(admin.topicPolicies().getMessageTTL(topic)),
                "topic message TTL read back");
        admin.topicPolicies().setRetention(topic, new RetentionPolicies(30, 10));
        RetentionPolicies r = admin.topicPolicies().getRetention(topic);
        c.check(r != null && r.getRetentionTimeInMinutes() == 30 && r.getRetentionSizeInMB() == 10,
                "topic retention read back");
        admin.topicPolicies().setPersistence(topic, new PersistencePolicies(1, 1, 1, 5.0));
        PersistencePolicies tp = admin.topicPolicies().getPersistence(topic);
        c.check(tp != null && tp.getBookkeeperEnsemble() == 1 && tp.getManagedLedgerMaxMarkDeleteRate() == 5.0,
                "topic persistence read back with its mark-delete rate");
        admin.namespaces().setPersistence(ns, new PersistencePolicies(1, 1, 1, 10.0));
        c.check(admin.namespaces().getPersistence(ns).getManagedLedgerMaxMarkDeleteRate() == 10.0,
                "namespace persistence keeps the mark-delete rate");
        admin.namespaces().setMaxProducersPerTopic(ns, 5);
        c.check(Integer.valueOf(1).equals(admin.topicPolicies().getMaxProducers(topic, true)),
                "applied maxProducers: topic over namespace");

        String schemaTopic = "persistent://" + ns + "/schema";
        String definition = "{\"type\":\"record\",\"name\":\"R\",\"fields\":[{\"name\":\"a\",\"type\":\"int\"}]}";
        admin.schemas().createSchema(schemaTopic, SchemaInfo.builder().name("schema")
                .type(SchemaType.AVRO).schema(definition.getBytes(StandardCharsets.UTF_8)).build());
        SchemaInfo info = admin.schemas().getSchemaInfo(schemaTopic);
        c.check(info.getType() == SchemaType.AVRO
                && definition.equals(new String(info.getSchema(), StandardCharsets.UTF_8)),
                "schema posted over REST read back");

        try (PulsarClient client = PulsarClient.builder().serviceUrl(serviceUrl)
                .operationTimeout(30, TimeUnit.SECONDS).build()) {
            MessageId first;
            try (Producer<byte[]> producer = client.newProducer().topic(topic).enableBatching(false).create()) {
                boolean refused = false;
                try (Producer<byte[]> second = client.newProducer().topic(topic).create()) {
                    refused = false;
                } catch (PulsarClientException.ProducerBusyException e) {
                    refused = true;
                }
                c.check(refused, "second producer refused by the topic's maxProducers 1");
                first = producer.send("one".getBytes(StandardCharsets.UTF_8));
                producer.send("two".getBytes(StandardCharsets.UTF_8));
            }
            boolean incompatible = false;
            try (Producer<String> p = client.newProducer(Schema.STRING).topic(schemaTopic).create()) {
                incompatible = false;
            } catch (PulsarClientException.IncompatibleSchemaException e) {
                incompatible = true;
            }
            c.check(incompatible, "producer of another schema type refused");

            admin.topics().createSubscription(topic, "peek", MessageId.earliest);
            List<Message<byte[]>> peeked = admin.topics().peekMessages(topic, "peek", 2);
            c.check(peeked.size() == 2 && "two".equals(new String(peeked.get(1).getData(), StandardCharsets.UTF_8)),
                    "peek 2 messages");
            MessageIdImpl id = (MessageIdImpl) first;
            Message<byte[]> byId = admin.topics().getMessageById(topic, id.getLedgerId(), id.getEntryId());
            c.check("one".equals(new String(byId.getData(), StandardCharsets.UTF_8)), "message by id");
        }
        admin.topicPolicies().removeMaxProducers(topic);
        c.check(admin.topicPolicies().getMaxProducers(topic) == null, "topic maxProducers removed");
        admin.schemas().deleteSchema(schemaTopic);
        try {
            admin.schemas().getSchemaInfo(schemaTopic);
            c.check(false, "schema deleted");
        } catch (PulsarAdminException.NotFoundException e) {
            c.check(true, "schema deleted");
        }
        admin.topics().delete(topic, true);
        try {
            admin.topics().delete(schemaTopic, true);
        } catch (PulsarAdminException.NotFoundException e) {
            // Never created: the refused producer's open may not have stayed.
        }
    }
}
