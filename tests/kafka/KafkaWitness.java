/*
 * KafkaWitness.java - Kafka's own Java client as an outside witness for the integration tests.
 *
 * Owns: reading a topic with the Java consumer and writing CloudEvents records with the Java
 * producer, printing what it saw as one tab-separated line per record for the C tests
 * (tests/integration/test_kafka_broker.c) to check. It never decides pass or fail about
 * outboxd itself: it reports, the tests judge. Run as a single-file program on the class path
 * that `scripts/kafka.sh classpath` prints:
 *
 *   java -cp CP tests/kafka/KafkaWitness.java consume BOOTSTRAP TOPIC COUNT TIMEOUT_MS
 *     Reads COUNT records from the beginning of every partition of TOPIC (no group, no commit),
 *     and on to the end offsets of that moment, then prints for each, in the order read:
 *       record PARTITION OFFSET DEFAULT_PARTITION KEY CE_SPECVERSION CE_ID CE_TYPE CE_SOURCE
 *              CE_SUBJECT CE_ORGID CE_PARTITIONKEY VALUE
 *     where DEFAULT_PARTITION is the partition Kafka's default partitioner gives the key
 *     (BuiltInPartitioner.partitionForKey: murmur2 of the key bytes) and a missing header is
 *     "-". Last line: "count N". Exits 1 when fewer than COUNT arrived before TIMEOUT_MS.
 *
 *   java -cp CP tests/kafka/KafkaWitness.java produce BOOTSTRAP TOPIC ORG TYPE PREFIX N KEYS
 *     Writes N CloudEvents binary-mode records (idempotent producer, acks=all, the default
 *     partitioner): key PREFIX-k<i mod KEYS>, ce_id PREFIX-<i>, value
 *     {"orderNumber": "PREFIX-<i>", "seq": i}, headers as the relay writes them (ce_specversion,
 *     ce_id, ce_source, ce_type, ce_time, ce_subject Order/<key>, ce_partitionkey, ce_orgid).
 *     Prints "sent ID PARTITION OFFSET" per record once acknowledged, then "count N".
 */
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.Future;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.clients.producer.internals.BuiltInPartitioner;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class KafkaWitness {
  private static final String[] CE_HEADERS = {
    "ce_specversion", "ce_id", "ce_type", "ce_source", "ce_subject", "ce_orgid", "ce_partitionkey"};

  public static void main(String[] args) throws Exception {
    if (args.length >= 5 && args[0].equals("consume")) {
      System.exit(consume(args[1], args[2], Integer.parseInt(args[3]), Long.parseLong(args[4])));
    } else if (args.length >= 8 && args[0].equals("produce")) {
      System.exit(produce(args[1], args[2], args[3], args[4], args[5], Integer.parseInt(args[6]),
                          Integer.parseInt(args[7])));
    }
    System.err.println("usage: KafkaWitness consume BOOTSTRAP TOPIC COUNT TIMEOUT_MS\n"
                       + "       KafkaWitness produce BOOTSTRAP TOPIC ORG TYPE PREFIX N KEYS");
    System.exit(2);
  }

  private static String text(byte[] b) {
    return b == null ? "-" : new String(b, StandardCharsets.UTF_8);
  }

  private static String header(Headers h, String name) {
    Header last = h.lastHeader(name);
    return last == null ? "-" : text(last.value());
  }

  private static int consume(String bootstrap, String topic, int count, long timeoutMs) {
    Properties p = new Properties();
    p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
    List<String> lines = new ArrayList<>();
    long deadline = System.currentTimeMillis() + timeoutMs;
    try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(p)) {
      List<PartitionInfo> infos = c.partitionsFor(topic, Duration.ofMillis(timeoutMs));
      int partitions = infos.size();
      List<TopicPartition> tps = new ArrayList<>();
      for (PartitionInfo pi : infos) tps.add(new TopicPartition(topic, pi.partition()));
      c.assign(tps);
      c.seekToBeginning(tps);
      // COUNT records, then on to the end offsets of that moment: a duplicate is seen too.
      java.util.Map<TopicPartition, Long> end = null;
      while (System.currentTimeMillis() < deadline) {
        if (lines.size() >= count) {
          if (end == null) end = c.endOffsets(tps);
          boolean atEnd = true;
          for (TopicPartition tp : tps) if (c.position(tp) < end.get(tp)) atEnd = false;
          if (atEnd) break;
        }
        for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
          StringBuilder sb = new StringBuilder("record");
          int expected = r.key() == null ? -1 : BuiltInPartitioner.partitionForKey(r.key(), partitions);
          sb.append('\t').append(r.partition()).append('\t').append(r.offset())
            .append('\t').append(expected).append('\t').append(text(r.key()));
          for (String h : CE_HEADERS) sb.append('\t').append(header(r.headers(), h));
          sb.append('\t').append(text(r.value()).replace('\t', ' ').replace('\n', ' '));
          lines.add(sb.toString());
        }
      }
    }
    for (String l : lines) System.out.println(l);
    System.out.println("count " + lines.size());
    return lines.size() >= count ? 0 : 1;
  }

  private static int produce(String bootstrap, String topic, String org, String type, String prefix,
                             int n, int keys) throws Exception {
    Properties p = new Properties();
    p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
    p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
    p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
    p.put(ProducerConfig.ACKS_CONFIG, "all");
    List<Future<RecordMetadata>> sent = new ArrayList<>();
    List<String> ids = new ArrayList<>();
    try (KafkaProducer<byte[], byte[]> prod = new KafkaProducer<>(p)) {
      for (int i = 0; i < n; i++) {
        String key = prefix + "-k" + (i % keys);
        String id = prefix + "-" + i;
        String value = "{\"orderNumber\": \"" + id + "\", \"seq\": " + i + "}";
        ProducerRecord<byte[], byte[]> r =
          new ProducerRecord<>(topic, key.getBytes(StandardCharsets.UTF_8), value.getBytes(StandardCharsets.UTF_8));
        Headers h = r.headers();
        h.add("ce_specversion", "1.0".getBytes(StandardCharsets.UTF_8));
        h.add("ce_id", id.getBytes(StandardCharsets.UTF_8));
        h.add("ce_source", "/witness/java".getBytes(StandardCharsets.UTF_8));
        h.add("ce_type", type.getBytes(StandardCharsets.UTF_8));
        h.add("ce_time", Instant.now().toString().getBytes(StandardCharsets.UTF_8));
        h.add("ce_subject", ("Order/" + key).getBytes(StandardCharsets.UTF_8));
        h.add("ce_partitionkey", key.getBytes(StandardCharsets.UTF_8));
        h.add("ce_orgid", org.getBytes(StandardCharsets.UTF_8));
        sent.add(prod.send(r));
        ids.add(id);
      }
      prod.flush();
      for (int i = 0; i < n; i++) {
        RecordMetadata m = sent.get(i).get();
        System.out.println("sent\t" + ids.get(i) + "\t" + m.partition() + "\t" + m.offset());
      }
    }
    System.out.println("count " + n);
    return 0;
  }
}
