package lakemq.qmq;

import java.util.HashMap;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import qunar.tc.qmq.Message;
import qunar.tc.qmq.MessageSendStateListener;
import qunar.tc.qmq.NeedRetryException;
import qunar.tc.qmq.SubscribeParam;
import qunar.tc.qmq.consumer.MessageConsumerProvider;
import qunar.tc.qmq.producer.MessageProducerProvider;

/**
 * Scenarios of unmodified QMQ client code (com.qunar.qmq:qmq) against lakemq's QMQ door. Every
 * line starting with '{' on standard output is one JSON event; the last one is "done".
 *
 *   produce --meta URL --subject S --count N [--prefix P] [--delay-ms D] (a delayed message: the delay producer)
 *   consume --meta URL --subject S --group G --count N [--timeout-ms T] [--client-id ID]
 *           [--halt-on-first true]   (the process dies in its listener's first call: nothing acked)
 *           [--fail-times K]         (the listener throws on a message's first K deliveries: a nack)
 *           [--retry-after-ms D]     (... throwing NeedRetryException(D ms) instead: a delayed retry)
 *           [--broadcast true]       (a broadcast consumer: SubscribeParam.setBroadcast)
 *           [--stop-file F]          (also stop, acks sent, once the file F exists)
 */
public final class Main {
    private Main() {}

    static synchronized void emit(String event, Object... kv) {
        StringBuilder sb = new StringBuilder("{\"event\":\"").append(event).append('"');
        for (int i = 0; i + 1 < kv.length; i += 2) {
            sb.append(",\"").append(kv[i]).append("\":");
            Object v = kv[i + 1];
            if (v instanceof Number || v instanceof Boolean) {
                sb.append(v);
            } else {
                sb.append('"').append(String.valueOf(v).replace("\\", "\\\\").replace("\"", "\\\"")).append('"');
            }
        }
        System.out.println(sb.append('}'));
        System.out.flush();
    }

    static Map<String, String> options(String[] args) {
        Map<String, String> out = new HashMap<>();
        for (int i = 1; i + 1 < args.length; i += 2) {
            out.put(args[i].replaceFirst("^--", ""), args[i + 1]);
        }
        return out;
    }

    public static void main(String[] args) throws Exception {
        Map<String, String> o = options(args);
        switch (args[0]) {
            case "produce":
                produce(o);
                break;
            case "consume":
                consume(o);
                break;
            default:
                throw new IllegalArgumentException("unknown scenario " + args[0]);
        }
        System.exit(0);
    }

    static void produce(Map<String, String> o) throws Exception {
        MessageProducerProvider producer = new MessageProducerProvider();
        producer.setAppCode("lakemq-harness");
        producer.setMetaServer(o.get("meta"));
        producer.setSyncSend(true);
        producer.init();
        String subject = o.get("subject");
        int count = Integer.parseInt(o.get("count"));
        String prefix = o.getOrDefault("prefix", "m");
        long delayMs = Long.parseLong(o.getOrDefault("delay-ms", "0"));
        AtomicInteger ok = new AtomicInteger();
        AtomicInteger failed = new AtomicInteger();
        for (int i = 0; i < count; i++) {
            Message message = producer.generateMessage(subject);
            String payload = prefix + "-" + i;
            message.setProperty("payload", payload);
            message.setProperty("index", i);
            if (delayMs > 0) {
                message.setDelayTime(delayMs, TimeUnit.MILLISECONDS);
            }
            CountDownLatch done = new CountDownLatch(1);
            producer.sendMessage(message, new MessageSendStateListener() {
                @Override
                public void onSuccess(Message m) {
                    ok.incrementAndGet();
                    emit("sent", "id", m.getMessageId(), "payload", payload);
                    done.countDown();
                }

                @Override
                public void onFailed(Message m) {
                    failed.incrementAndGet();
                    emit("failed", "id", m.getMessageId(), "payload", payload);
                    done.countDown();
                }
            });
            if (!done.await(60, TimeUnit.SECONDS)) {
                failed.incrementAndGet();
                emit("failed", "id", message.getMessageId(), "payload", payload, "reason", "no answer in 60 s");
            }
        }
        emit("done", "sent", ok.get(), "failed", failed.get());
        producer.destroy();
    }

    static void consume(Map<String, String> o) throws Exception {
        MessageConsumerProvider consumer = new MessageConsumerProvider();
        consumer.setAppCode("lakemq-harness");
        consumer.setMetaServer(o.get("meta"));
        consumer.setDestroyWaitInSeconds(5);
        String clientId = o.get("client-id");
        if (clientId != null) {
            consumer.setClientIdProvider(() -> clientId);
        }
        boolean haltOnFirst = Boolean.parseBoolean(o.getOrDefault("halt-on-first", "false"));
        int failTimes = Integer.parseInt(o.getOrDefault("fail-times", "0"));
        int retryAfterMs = Integer.parseInt(o.getOrDefault("retry-after-ms", "0"));
        boolean broadcast = Boolean.parseBoolean(o.getOrDefault("broadcast", "false"));
        Map<String, AtomicInteger> attempts = new ConcurrentHashMap<>();
        consumer.init();
        int count = Integer.parseInt(o.get("count"));
        long timeoutMs = Long.parseLong(o.getOrDefault("timeout-ms", "60000"));
        Set<String> seen = ConcurrentHashMap.newKeySet();
        AtomicInteger deliveries = new AtomicInteger();
        CountDownLatch all = new CountDownLatch(count);
        ExecutorService executor = Executors.newFixedThreadPool(haltOnFirst ? 1 : 2);
        consumer.addListener(o.get("subject"), o.get("group"), msg -> {
            deliveries.incrementAndGet();
            String payload = msg.getStringProperty("payload");
            int attempt = attempts.computeIfAbsent(msg.getMessageId(), k -> new AtomicInteger()).incrementAndGet();
            emit("received", "id", msg.getMessageId(), "payload", payload, "subject", msg.getSubject(),
                    "times", msg.times(), "attempt", attempt, "at", System.currentTimeMillis());
            if (haltOnFirst) {
                Runtime.getRuntime().halt(3);
            }
            if (attempt <= failTimes && retryAfterMs > 0) {
                throw new NeedRetryException(retryAfterMs, TimeUnit.MILLISECONDS, "retry later, on purpose");
            }
            if (attempt <= failTimes) {
                throw new RuntimeException("failing attempt " + attempt + " on purpose");
            }
            if (seen.add(msg.getMessageId())) {
                all.countDown();
            }
        }, executor, new SubscribeParam.SubscribeParamBuilder().setBroadcast(broadcast).create());
        emit("ready");
        java.io.File stopFile = o.containsKey("stop-file") ? new java.io.File(o.get("stop-file")) : null;
        long deadline = System.currentTimeMillis() + timeoutMs;
        boolean complete = false;
        while (!complete && System.currentTimeMillis() < deadline && (stopFile == null || !stopFile.exists())) {
            complete = all.await(100, TimeUnit.MILLISECONDS);
        }
        // The acks go out in the client's ack batches: let them leave before the client stops.
        consumer.destroy();
        executor.shutdown();
        emit("done", "received", seen.size(), "deliveries", deliveries.get(), "complete", complete);
    }
}
