package lakemq.rmq5;

import java.nio.charset.StandardCharsets;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.rocketmq.client.apis.ClientException;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.message.MessageBuilder;
import org.apache.rocketmq.client.apis.producer.Producer;
import org.apache.rocketmq.client.apis.producer.SendReceipt;
import org.apache.rocketmq.client.java.impl.producer.SendReceiptImpl;
import org.apache.rocketmq.client.apis.producer.Transaction;
import org.apache.rocketmq.client.apis.producer.TransactionResolution;

/** Producer scenarios: synchronous sends of normal, delay and FIFO messages; transactions. */
final class Producers {
    private Producers() {}

    /** Message {@code i}: body {@code <prefix>-i}, tag TagA, key {@code <prefix>-key-i}, property index. */
    private static MessageBuilder message(String topic, String prefix, int i) {
        return Clients.PROVIDER.newMessageBuilder()
                .setTopic(topic)
                .setBody((prefix + "-" + i).getBytes(StandardCharsets.UTF_8))
                .setTag("TagA")
                .setKeys(prefix + "-key-" + i)
                .addProperty("index", Integer.toString(i));
    }

    /**
     * {@code --count} synchronous sends of one {@code --kind}: normal; delay (due {@code --delay-ms}
     * from now); fifo (message group {@code <prefix>-g<i % groups>}). One "sent" event per message.
     */
    static int produce(Args args) throws Exception {
        String topic = args.str("topic");
        String kind = args.str("kind", "normal");
        String prefix = args.str("prefix", kind);
        int count = args.integer("count", 1);
        int groups = args.integer("groups", 2);
        long delayMs = args.longer("delay-ms", 3_600_000);
        int failed = 0;
        try (Producer producer = Clients.PROVIDER.newProducerBuilder()
                .setClientConfiguration(Clients.config(args))
                .setTopics(topic)
                .build()) {
            Out.emit("event", "ready");
            for (int i = 0; i < count; i++) {
                MessageBuilder builder = message(topic, prefix, i);
                String group = null;
                Long due = null;
                switch (kind) {
                    case "normal" -> { }
                    case "delay" -> {
                        due = System.currentTimeMillis() + delayMs;
                        builder.setDeliveryTimestamp(due);
                    }
                    case "fifo" -> {
                        group = prefix + "-g" + (i % groups);
                        builder.setMessageGroup(group);
                    }
                    default -> throw new IllegalArgumentException("unknown kind " + kind);
                }
                try {
                    SendReceipt receipt = producer.send(builder.build());
                    Out.emit("event", "sent", "id", receipt.getMessageId().toString(), "body", prefix + "-" + i,
                            "index", i, "group", group, "delivery_ms", due, "queue", queueOf(receipt));
                } catch (ClientException e) {
                    failed++;
                    Out.emit("event", "send_failed", "index", i, "error", String.valueOf(e));
                }
            }
        }
        Out.emit("event", "done", "sent", count - failed, "failed", failed);
        return 0;
    }

    /**
     * {@code --count} transactions of one message each: i % 3 == 0 committed, 1 rolled back, 2 left
     * open for the server to check back ({@link TransactionResolution#COMMIT} from the checker).
     * Waits up to {@code --check-wait-ms} for the check-backs before closing.
     */
    static int transaction(Args args) throws Exception {
        String topic = args.str("topic");
        String prefix = args.str("prefix", "tx");
        int count = args.integer("count", 3);
        long waitMs = args.longer("check-wait-ms", 20_000);
        Set<String> checked = ConcurrentHashMap.newKeySet();
        int open = 0;
        try (Producer producer = Clients.PROVIDER.newProducerBuilder()
                .setClientConfiguration(Clients.config(args))
                .setTopics(topic)
                .setTransactionChecker(view -> {
                    checked.add(view.getMessageId().toString());
                    Out.emit(Clients.event("checked", view));
                    return TransactionResolution.COMMIT;
                })
                .build()) {
            Out.emit("event", "ready");
            for (int i = 0; i < count; i++) {
                Transaction transaction = producer.beginTransaction();
                Message message = message(topic, prefix, i).build();
                SendReceipt receipt = producer.send(message, transaction);
                String decision = switch (i % 3) {
                    case 0 -> "commit";
                    case 1 -> "rollback";
                    default -> "open";
                };
                if (i % 3 == 0) {
                    transaction.commit();
                } else if (i % 3 == 1) {
                    transaction.rollback();
                } else {
                    open++;
                }
                Out.emit("event", "sent", "id", receipt.getMessageId().toString(), "body", prefix + "-" + i,
                        "index", i, "decision", decision);
            }
            long deadline = System.currentTimeMillis() + waitMs;
            while (checked.size() < open && System.currentTimeMillis() < deadline) {
                Thread.sleep(100);
            }
        }
        Out.emit("event", "done", "sent", count, "checked", checked.size(), "open", open);
        return 0;
    }

    /** The queue the client sent to, as its receipt names it (the client's own class has it). */
    static int queueOf(SendReceipt receipt) {
        return receipt instanceof SendReceiptImpl impl ? impl.getMessageQueue().getQueueId() : -1;
    }
}
