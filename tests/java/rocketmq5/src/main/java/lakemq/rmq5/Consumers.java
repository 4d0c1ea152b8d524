package lakemq.rmq5;

import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;
import org.apache.rocketmq.client.apis.consumer.PushConsumer;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.MessageView;

/** Consumer scenarios: a SimpleConsumer's receive / ack / changeInvisibleDuration, a PushConsumer. */
final class Consumers {
    private Consumers() {}

    private static Map<String, FilterExpression> subscription(Args args) {
        return Map.of(args.str("topic"), new FilterExpression(args.str("filter", "*"), FilterExpressionType.TAG));
    }

    /**
     * A SimpleConsumer receives until it has seen {@code --expect} messages (or {@code --timeout-ms}).
     * {@code --mode ack}: each received message is acked. {@code retry}: the first delivery of each
     * message is made visible again in 1 s (changeInvisibleDuration) and acked when it comes again.
     * {@code change}: each message's invisible time is extended to 60 s, then it is acked (with the
     * handle the change returned: the client keeps it). Events: received, acked, changed, failed.
     */
    static int simple(Args args) throws Exception {
        String mode = args.str("mode", "ack");
        int expect = args.integer("expect", 1);
        long deadline = System.currentTimeMillis() + args.longer("timeout-ms", 20_000);
        Duration invisible = Duration.ofMillis(args.longer("invisible-ms", 15_000));
        Set<String> done = ConcurrentHashMap.newKeySet();
        int received = 0;
        try (SimpleConsumer consumer = Clients.PROVIDER.newSimpleConsumerBuilder()
                .setClientConfiguration(Clients.config(args))
                .setConsumerGroup(args.str("group"))
                .setAwaitDuration(Duration.ofMillis(args.longer("await-ms", 2_000)))
                .setSubscriptionExpressions(subscription(args))
                .build()) {
            Out.emit("event", "ready");
            while (done.size() < expect && System.currentTimeMillis() < deadline) {
                List<MessageView> got = consumer.receive(16, invisible);
                for (MessageView message : got) {
                    received++;
                    Out.emit(Clients.event("received", message));
                    String id = message.getMessageId().toString();
                    try {
                        if (mode.equals("retry") && message.getDeliveryAttempt() == 1) {
                            consumer.changeInvisibleDuration(message, Duration.ofSeconds(1));
                            Out.emit("event", "changed", "id", id);
                            continue;
                        }
                        if (mode.equals("change")) {
                            consumer.changeInvisibleDuration(message, Duration.ofSeconds(60));
                            Out.emit("event", "changed", "id", id);
                        }
                        consumer.ack(message);
                        done.add(id);
                        Out.emit("event", "acked", "id", id);
                    } catch (Exception e) {
                        Out.emit("event", "failed", "id", id, "error", String.valueOf(e));
                    }
                }
            }
        }
        Out.emit("event", "done", "received", received, "acked", done.size(), "complete", done.size() >= expect);
        return 0;
    }

    /**
     * A PushConsumer whose listener returns SUCCESS, or with {@code --fail-first true} FAILURE at a
     * message's first attempt (the client makes it visible again after its backoff); runs until
     * {@code --expect} messages succeeded (or {@code --timeout-ms}). Events: received (with the
     * attempt and the listener's result).
     */
    static int push(Args args) throws Exception {
        int expect = args.integer("expect", 1);
        boolean failFirst = Boolean.parseBoolean(args.str("fail-first", "false"));
        Set<String> succeeded = ConcurrentHashMap.newKeySet();
        CountDownLatch complete = new CountDownLatch(1);
        try (PushConsumer consumer = Clients.PROVIDER.newPushConsumerBuilder()
                .setClientConfiguration(Clients.config(args))
                .setConsumerGroup(args.str("group"))
                .setSubscriptionExpressions(subscription(args))
                .setConsumptionThreadCount(args.integer("threads", 4))
                .setMessageListener(message -> {
                    boolean fail = failFirst && message.getDeliveryAttempt() == 1;
                    Map<String, Object> event = Clients.event("received", message);
                    event.put("result", fail ? "FAILURE" : "SUCCESS");
                    Out.emit(event);
                    if (fail) {
                        return ConsumeResult.FAILURE;
                    }
                    succeeded.add(message.getMessageId().toString());
                    if (succeeded.size() >= expect) {
                        complete.countDown();
                    }
                    return ConsumeResult.SUCCESS;
                })
                .build()) {
            Out.emit("event", "ready");
            complete.await(args.longer("timeout-ms", 20_000), TimeUnit.MILLISECONDS);
            Thread.sleep(args.longer("linger-ms", 500)); // the last acks leave before the close
        }
        Out.emit("event", "done", "succeeded", succeeded.size(), "complete", succeeded.size() >= expect);
        return 0;
    }
}
