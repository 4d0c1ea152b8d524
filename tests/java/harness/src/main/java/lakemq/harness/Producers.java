package lakemq.harness;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.SendCallback;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

/** DefaultMQProducer and TransactionMQProducer scenarios: every message sent is reported with its key. */
final class Producers {
    private Producers() {}

    static String instance(Args args, String fallback) {
        return args.str("instance", fallback + "-" + ProcessHandle.current().pid());
    }

    static void configure(DefaultMQProducer producer, Args args) {
        producer.setNamesrvAddr(args.str("namesrv"));
        producer.setInstanceName(instance(args, "producer"));
        producer.setSendMsgTimeout(args.integer("send-timeout-ms", 10_000));
        producer.setRetryTimesWhenSendFailed(args.integer("retries", 2));
        producer.setRetryTimesWhenSendAsyncFailed(args.integer("retries", 2));
        producer.setVipChannelEnabled(false);
    }

    /**
     * Asks for the topic's route until the client has it (or --route-wait-ms): a route query the
     * name server answers after the client's 3 s timeout would otherwise fail the first send. Reports
     * how many attempts failed, so a slow name server shows.
     */
    static void awaitRoute(DefaultMQProducer producer, Args args) throws Exception {
        String topic = args.str("topic");
        long deadline = System.currentTimeMillis() + args.integer("route-wait-ms", 60_000);
        int failed = 0;
        while (true) {
            try {
                if (!producer.fetchPublishMessageQueues(topic).isEmpty()) {
                    break;
                }
            } catch (Exception e) {
                if (System.currentTimeMillis() > deadline) {
                    throw e;
                }
            }
            failed++;
            Thread.sleep(200);
        }
        Out.emit("event", "route", "topic", topic, "failedAttempts", failed);
    }

    /** Message {@code i} of a run: key {@code <prefix>-<i>}, user property {@code seq}, a body naming it. */
    static Message message(Args args, int i) {
        String key = args.str("prefix", "k") + "-" + i;
        byte[] body = body(key, args.integer("body-bytes", 0));
        Message message = new Message(args.str("topic"), args.str("tags", "TagA"), key, body);
        message.putUserProperty("seq", Integer.toString(i));
        return message;
    }

    static byte[] body(String key, int size) {
        byte[] text = ("body-" + key).getBytes(StandardCharsets.UTF_8);
        if (size <= text.length) {
            return text;
        }
        byte[] out = new byte[size];
        System.arraycopy(text, 0, out, 0, text.length);
        for (int i = text.length; i < size; i++) {
            out[i] = (byte) ('a' + i % 26);
        }
        return out;
    }

    static Map<String, Object> sent(String key, SendResult result, int index) {
        MessageQueue queue = result.getMessageQueue();
        String[] ids = result.getMsgId() == null ? new String[] {""} : result.getMsgId().split(",");
        String[] offsetIds = result.getOffsetMsgId() == null ? new String[] {""} : result.getOffsetMsgId().split(",");
        return Out.obj(
            "event", "sent",
            "key", key,
            "status", result.getSendStatus().name(),
            "msgId", ids[Math.min(index, ids.length - 1)],
            "offsetMsgId", offsetIds[Math.min(index, offsetIds.length - 1)],
            "topic", queue.getTopic(),
            "brokerName", queue.getBrokerName(),
            "queueId", queue.getQueueId(),
            "queueOffset", result.getQueueOffset() + index);
    }

    static void failed(String key, Throwable error) {
        Out.emit("event", "send_failed", "key", key, "error", String.valueOf(error));
    }

    /**
     * --hold-file PATH: after its sends the producer stays up, as a long-running program does, until
     * the file exists (or --timeout-ms): what the client still sends in the background (its message
     * trace, whose sends its shutdown drops) reaches the server meanwhile. Prints "holding" first.
     */
    static void holdUntil(Args args) throws InterruptedException {
        String hold = args.str("hold-file", "");
        if (hold.isEmpty()) {
            return;
        }
        Out.emit("event", "holding");
        long deadline = System.currentTimeMillis() + args.integer("timeout-ms", 60_000);
        while (!Files.exists(Path.of(hold)) && System.currentTimeMillis() < deadline) {
            Thread.sleep(50);
        }
    }

    static int produce(Args args) throws Exception {
        String mode = args.str("mode", "sync");
        int count = args.integer("count", 10);
        // --trace true: the client's own message trace (records sent to RMQ_SYS_TRACE_TOPIC).
        boolean trace = "true".equals(args.str("trace", "false"));
        DefaultMQProducer producer = new DefaultMQProducer(args.str("group", "HarnessProducer"), trace);
        configure(producer, args);
        producer.start();
        try {
            awaitRoute(producer, args);
            switch (mode) {
                case "sync", "delay" -> {
                    int level = args.integer("delay-level", 0);
                    for (int i = 0; i < count; i++) {
                        Message message = message(args, i);
                        if (level > 0) {
                            message.setDelayTimeLevel(level);
                        }
                        try {
                            Map<String, Object> event = sent(message.getKeys(), producer.send(message), 0);
                            event.put("bornMs", System.currentTimeMillis());
                            Out.emit(event);
                        } catch (Exception e) {
                            failed(message.getKeys(), e);
                        }
                    }
                }
                case "async" -> {
                    CountDownLatch done = new CountDownLatch(count);
                    for (int i = 0; i < count; i++) {
                        Message message = message(args, i);
                        producer.send(message, new SendCallback() {
                            @Override
                            public void onSuccess(SendResult result) {
                                Out.emit(sent(message.getKeys(), result, 0));
                                done.countDown();
                            }

                            @Override
                            public void onException(Throwable error) {
                                failed(message.getKeys(), error);
                                done.countDown();
                            }
                        });
                    }
                    if (!done.await(args.integer("timeout-ms", 60_000), TimeUnit.MILLISECONDS)) {
                        Out.emit("event", "timeout", "pending", done.getCount());
                    }
                }
                case "oneway" -> {
                    for (int i = 0; i < count; i++) {
                        Message message = message(args, i);
                        producer.sendOneway(message);
                        Out.emit("event", "sent", "key", message.getKeys(), "status", "ONEWAY");
                    }
                }
                case "batch" -> {
                    int size = args.integer("batch-size", 8);
                    for (int start = 0; start < count; start += size) {
                        List<Message> batch = new ArrayList<>();
                        for (int i = start; i < Math.min(count, start + size); i++) {
                            batch.add(message(args, i));
                        }
                        try {
                            SendResult result = producer.send(batch);
                            for (int j = 0; j < batch.size(); j++) {
                                Out.emit(sent(batch.get(j).getKeys(), result, j));
                            }
                        } catch (Exception e) {
                            for (Message m : batch) {
                                failed(m.getKeys(), e);
                            }
                        }
                    }
                }
                case "ordered" -> {
                    int orders = args.integer("orders", 3);
                    for (int i = 0; i < count; i++) {
                        Message message = message(args, i);
                        int order = i % orders;
                        message.putUserProperty("order", Integer.toString(order));
                        try {
                            SendResult result = producer.send(
                                message, (queues, msg, arg) -> queues.get((Integer) arg % queues.size()), order);
                            Map<String, Object> event = sent(message.getKeys(), result, 0);
                            event.put("order", order);
                            Out.emit(event);
                        } catch (Exception e) {
                            failed(message.getKeys(), e);
                        }
                    }
                }
                default -> throw new IllegalArgumentException("unknown produce mode " + mode);
            }
            holdUntil(args);
        } finally {
            producer.shutdown();
        }
        Out.emit("event", "done", "mode", mode, "count", count);
        return 0;
    }

    /**
     * TransactionMQProducer: message i commits when i % 3 == 0, rolls back when i % 3 == 1 and answers
     * UNKNOW when i % 3 == 2, whose check-back then commits. Waits for every check-back (or
     * --check-wait-ms).
     */
    static int transaction(Args args) throws Exception {
        int count = args.integer("count", 9);
        Set<String> unknown = ConcurrentHashMap.newKeySet();
        Set<String> checked = ConcurrentHashMap.newKeySet();
        TransactionMQProducer producer = new TransactionMQProducer(args.str("group", "HarnessTxProducer"));
        configure(producer, args);
        producer.setTransactionListener(new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message message, Object arg) {
                return switch ((Integer) arg % 3) {
                    case 0 -> LocalTransactionState.COMMIT_MESSAGE;
                    case 1 -> LocalTransactionState.ROLLBACK_MESSAGE;
                    default -> LocalTransactionState.UNKNOW;
                };
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt message) {
                Out.emit(
                    "event", "checked",
                    "key", message.getKeys(),
                    "transactionId", message.getTransactionId(),
                    "again", !checked.add(message.getKeys()));
                return LocalTransactionState.COMMIT_MESSAGE;
            }
        });
        producer.start();
        try {
            awaitRoute(producer, args);
            for (int i = 0; i < count; i++) {
                Message message = message(args, i);
                try {
                    TransactionSendResult result = producer.sendMessageInTransaction(message, i);
                    Map<String, Object> event = sent(message.getKeys(), result, 0);
                    event.put("localState", result.getLocalTransactionState().name());
                    Out.emit(event);
                    if (result.getLocalTransactionState() == LocalTransactionState.UNKNOW) {
                        unknown.add(message.getKeys());
                    }
                } catch (Exception e) {
                    failed(message.getKeys(), e);
                }
            }
            long deadline = System.currentTimeMillis() + args.integer("check-wait-ms", 60_000);
            while (!checked.containsAll(unknown) && System.currentTimeMillis() < deadline) {
                Thread.sleep(100);
            }
        } finally {
            producer.shutdown();
        }
        Out.emit("event", "done", "unknown", unknown.size(), "checked", checked.size());
        return 0;
    }
}
