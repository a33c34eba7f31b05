// Reads a topic the Kafka sink wrote the way a consumer written for Debezium does: every key and
// value through Kafka Connect's own JsonConverter (toConnectData), with schemas.enable=true
// ("schemas") or false ("plain"). Used by tests/integration/test_kafka_connect_compat.py.
//
//   java -cp "<kafka jars>/*:<classes>" ConnectRead <bootstrap servers> <topic> schemas|plain
//
// Consumes every partition of the topic from the beginning to the end offsets it had at the
// start (no consumer group, nothing committed) and prints one JSON line per message to stdout:
//
//   {"partition": 0, "offset": 3, "tombstone": false, "op": "u",
//    "key": <node>, "value": <node>, "mismatches": [...]}
//
// where a <node> describes what the converter returned, with the Java class of every value:
//   a Struct: {"class": "Struct", "schemaName": ..., "fields": {name: <node>, ...}}
//   a Map:    {"class": "HashMap", "entries": {key: <node>, ...}}
//   a List:   {"class": "ArrayList", "items": [<node>, ...]}
//   a leaf:   {"class": "Integer", "value": 7}  (byte[]: its bytes as base64; NaN: "NaN";
//             a BigDecimal: its exact text, "18446744073709551615")
// and in schemas mode every node also has "schemaType", "schemaName" and "optional" (the
// Connect schema the converter attached to it).
//
// "mismatches" (schemas mode) lists the payload values whose JSON type is not the declared
// schema's: JsonConverter converts without checking (a string in a float64 field becomes 0.0,
// a payload field the schema does not name is dropped), so this reader checks what it does not.
//
// Exit status: 0 when every message converted; 1 with the message on stderr when a conversion
// (or Struct.validate) threw; 2 for bad arguments or when the end offsets are not reached in
// time.

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.PrintStream;
import java.math.BigDecimal;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collection;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.connect.data.Decimal;
import org.apache.kafka.connect.data.Field;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.data.SchemaAndValue;
import org.apache.kafka.connect.data.Struct;
import org.apache.kafka.connect.json.JsonConverter;

public final class ConnectRead {
  private static final JsonNodeFactory NODES = JsonNodeFactory.instance;
  private static final ObjectMapper MAPPER = new ObjectMapper();
  private static final Duration TIMEOUT = Duration.ofSeconds(60);

  private ConnectRead() {}

  public static void main(String[] args) throws Exception {
    // Our lines alone on stdout: anything a library prints (logging) goes to stderr.
    PrintStream out = new PrintStream(System.out, true, StandardCharsets.UTF_8);
    System.setOut(System.err);
    if (args.length != 3 || !(args[2].equals("schemas") || args[2].equals("plain"))) {
      System.err.println("usage: ConnectRead <bootstrap servers> <topic> schemas|plain");
      System.exit(2);
    }
    String bootstrap = args[0];
    String topic = args[1];
    boolean schemas = args[2].equals("schemas");

    JsonConverter keys = new JsonConverter();
    keys.configure(Map.of("schemas.enable", Boolean.toString(schemas)), true);
    JsonConverter values = new JsonConverter();
    values.configure(Map.of("schemas.enable", Boolean.toString(schemas)), false);

    Properties props = new Properties();
    props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    props.put(ConsumerConfig.CLIENT_ID_CONFIG, "snapshotter-connect-read");

    try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
      List<PartitionInfo> infos = consumer.partitionsFor(topic, TIMEOUT);
      if (infos == null || infos.isEmpty()) {
        System.err.println("topic " + topic + " has no partitions (does it exist?)");
        System.exit(2);
      }
      List<TopicPartition> partitions = new ArrayList<>();
      for (PartitionInfo info : infos) {
        partitions.add(new TopicPartition(topic, info.partition()));
      }
      consumer.assign(partitions);
      consumer.seekToBeginning(partitions);
      Map<TopicPartition, Long> end = consumer.endOffsets(partitions, TIMEOUT);
      long deadline = System.nanoTime() + TIMEOUT.toNanos();
      while (!reached(consumer, end)) {
        if (System.nanoTime() > deadline) {
          System.err.println("the end offsets " + end + " were not reached within " + TIMEOUT);
          System.exit(2);
        }
        for (ConsumerRecord<byte[], byte[]> record : consumer.poll(Duration.ofMillis(500))) {
          TopicPartition tp = new TopicPartition(record.topic(), record.partition());
          if (record.offset() >= end.get(tp)) {
            continue; // written after we started: not ours to read
          }
          String where = "partition " + record.partition() + " offset " + record.offset();
          ObjectNode line = NODES.objectNode();
          line.put("partition", record.partition());
          line.put("offset", record.offset());
          line.put("tombstone", record.value() == null);
          ArrayNode mismatches = NODES.arrayNode();
          line.set("key", convert(keys, topic, record.key(), schemas, where + " key", mismatches));
          JsonNode value = convert(values, topic, record.value(), schemas, where + " value", mismatches);
          line.set("value", value);
          line.set("op", op(value));
          line.set("mismatches", mismatches);
          out.println(MAPPER.writeValueAsString(line));
        }
      }
    }
  }

  private static boolean reached(KafkaConsumer<byte[], byte[]> consumer, Map<TopicPartition, Long> end) {
    for (Map.Entry<TopicPartition, Long> e : end.entrySet()) {
      if (consumer.position(e.getKey(), TIMEOUT) < e.getValue()) {
        return false;
      }
    }
    return true;
  }

  /** The converter's result for one key or value, described; exits 1 when conversion fails. */
  private static JsonNode convert(
      JsonConverter converter, String topic, byte[] data, boolean schemas, String where,
      ArrayNode mismatches) {
    SchemaAndValue result;
    try {
      result = converter.toConnectData(topic, data);
      if (result.value() instanceof Struct struct) {
        struct.validate(); // what a Connect sink's Struct access would trip over
      }
    } catch (RuntimeException exc) {
      String text = data == null ? "null" : new String(data, StandardCharsets.UTF_8);
      System.err.println("JsonConverter (schemas.enable=" + schemas + ") failed on " + where + ": "
          + exc + (exc.getCause() != null ? " (cause: " + exc.getCause() + ")" : "")
          + "\n  message: " + (text.length() > 4000 ? text.substring(0, 4000) + "..." : text));
      System.exit(1);
      throw exc; // not reached
    }
    if (schemas && data != null && result.schema() != null) {
      try {
        JsonNode payload = MAPPER.readTree(data).get("payload");
        check(where, "", result.schema(), payload, mismatches);
      } catch (java.io.IOException exc) {
        throw new RuntimeException(exc);
      }
    }
    return describe(result.value(), result.schema());
  }

  private static JsonNode op(JsonNode value) {
    if (value == null || value.isNull()) {
      return NODES.nullNode();
    }
    JsonNode fields = value.has("fields") ? value.get("fields") : value.get("entries");
    if (fields == null || fields.get("op") == null) {
      return NODES.nullNode();
    }
    return fields.get("op").get("value");
  }

  private static JsonNode describe(Object value, Schema schema) {
    if (value == null && schema == null) {
      return NODES.nullNode();
    }
    ObjectNode node = NODES.objectNode();
    node.put("class", value == null ? null : value.getClass().getSimpleName());
    if (schema != null) {
      node.put("schemaType", schema.type().toString());
      node.put("schemaName", schema.name());
      node.put("optional", schema.isOptional());
    }
    if (value instanceof Struct struct) {
      ObjectNode fields = NODES.objectNode();
      for (Field field : struct.schema().fields()) {
        fields.set(field.name(), describe(struct.get(field), field.schema()));
      }
      node.set("fields", fields);
    } else if (value instanceof Map<?, ?> map) {
      ObjectNode entries = NODES.objectNode();
      Schema valueSchema = schema == null ? null : schema.valueSchema();
      for (Map.Entry<?, ?> e : map.entrySet()) {
        entries.set(String.valueOf(e.getKey()), describe(e.getValue(), valueSchema));
      }
      node.set("entries", entries);
    } else if (value instanceof Collection<?> list) {
      ArrayNode items = NODES.arrayNode();
      Schema valueSchema = schema == null ? null : schema.valueSchema();
      for (Object item : list) {
        items.add(describe(item, valueSchema));
      }
      node.set("items", items);
    } else {
      node.set("value", leaf(value));
    }
    return node;
  }

  private static JsonNode leaf(Object value) {
    if (value == null) {
      return NODES.nullNode();
    } else if (value instanceof byte[] bytes) {
      return NODES.textNode(Base64.getEncoder().encodeToString(bytes));
    } else if (value instanceof ByteBuffer buffer) {
      byte[] bytes = new byte[buffer.remaining()];
      buffer.duplicate().get(bytes);
      return NODES.textNode(Base64.getEncoder().encodeToString(bytes));
    } else if (value instanceof Boolean b) {
      return NODES.booleanNode(b);
    } else if (value instanceof Float f) {
      return f.isNaN() || f.isInfinite() ? NODES.textNode(f.toString()) : NODES.numberNode(f);
    } else if (value instanceof Double d) {
      return d.isNaN() || d.isInfinite() ? NODES.textNode(d.toString()) : NODES.numberNode(d);
    } else if (value instanceof Byte n) {
      return NODES.numberNode(n);
    } else if (value instanceof Short n) {
      return NODES.numberNode(n);
    } else if (value instanceof Integer n) {
      return NODES.numberNode(n);
    } else if (value instanceof Long n) {
      return NODES.numberNode(n);
    } else if (value instanceof BigDecimal d) {
      return NODES.textNode(d.toPlainString()); // exact, never an exponent
    }
    return NODES.textNode(value.toString());
  }

  /** Record where the payload's JSON does not have the type its declared schema says. */
  private static void check(String where, String path, Schema schema, JsonNode node, ArrayNode out) {
    String at = path.isEmpty() ? "(top)" : path;
    if (node == null || node.isNull()) {
      if (!schema.isOptional() && schema.defaultValue() == null) {
        mismatch(out, where, at, schema, node, "null for a required field");
      }
      return;
    }
    boolean ok;
    switch (schema.type()) {
      case INT8 -> ok = node.isIntegralNumber() && node.canConvertToInt()
          && node.intValue() >= Byte.MIN_VALUE && node.intValue() <= Byte.MAX_VALUE;
      case INT16 -> ok = node.isIntegralNumber() && node.canConvertToInt()
          && node.intValue() >= Short.MIN_VALUE && node.intValue() <= Short.MAX_VALUE;
      case INT32 -> ok = node.isIntegralNumber() && node.canConvertToInt();
      case INT64 -> ok = node.isIntegralNumber() && node.canConvertToLong();
      case FLOAT32, FLOAT64 -> ok = node.isNumber();
      case BOOLEAN -> ok = node.isBoolean();
      case STRING -> ok = node.isTextual();
      case BYTES -> {
        boolean decodes;
        try {
          decodes = node.isTextual() && node.binaryValue() != null;
        } catch (java.io.IOException exc) {
          decodes = false;
        }
        // a Decimal is also read from a JSON number, exactly (JsonNode.decimalValue())
        ok = decodes || (Decimal.LOGICAL_NAME.equals(schema.name()) && node.isNumber());
      }
      case STRUCT -> {
        ok = node.isObject();
        if (ok) {
          Set<String> declared = new HashSet<>();
          for (Field field : schema.fields()) {
            declared.add(field.name());
            check(where, path.isEmpty() ? field.name() : path + "." + field.name(),
                field.schema(), node.get(field.name()), out);
          }
          node.fieldNames().forEachRemaining(name -> {
            if (!declared.contains(name)) {
              mismatch(out, where, path.isEmpty() ? name : path + "." + name, null, node.get(name),
                  "payload field the schema does not declare (JsonConverter drops it)");
            }
          });
        }
      }
      case ARRAY -> ok = node.isArray();
      case MAP -> ok = node.isObject() || node.isArray();
      default -> ok = true;
    }
    if (!ok) {
      mismatch(out, where, at, schema, node, "payload's JSON type is not the declared type");
    }
  }

  private static void mismatch(
      ArrayNode out, String where, String path, Schema schema, JsonNode node, String why) {
    ObjectNode m = NODES.objectNode();
    m.put("where", where);
    m.put("path", path);
    m.put("declared", schema == null ? null
        : schema.type() + (schema.name() != null ? " " + schema.name() : "")
            + (schema.isOptional() ? " optional" : ""));
    m.put("payload", node == null ? "absent" : node.toString());
    m.put("why", why);
    out.add(m);
  }
}
