package lakemq.harness;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.common.protocol.heartbeat.MessageModel;

/** DefaultMQPushConsumer and DefaultLitePullConsumer scenarios: every message received is reported. */
final class Consumers {
    private Consumers() {}

    /** Counts what was received and says when to stop: the expected count reached (then a linger for
     * duplicates), or the timeout. */
    static final class Tally {
        final long expect;
        final AtomicLong received = new AtomicLong();
        final AtomicLong lastAt = new AtomicLong(System.currentTimeMillis());

        Tally(long expect) {
            this.expect = expect;
        }

        void add(int n) {
            received.addAndGet(n);
            lastAt.set(System.currentTimeMillis());
        }

        /** Waits; true when the expected count was reached, false on the timeout. */
        boolean await(long lingerMs, long timeoutMs) throws InterruptedException {
            long deadline = System.currentTimeMillis() + timeoutMs;
            while (System.currentTimeMillis() < deadline) {
                if (received.get() >= expect && System.currentTimeMillis() - lastAt.get() >= lingerMs) {
                    return true;
                }
                Thread.sleep(50);
            }
            return received.get() >= expect;
        }
    }

    static Map<String, Object> received(String instance, MessageExt m) {
        return Out.obj(
            "event", "received",
            "instance", instance,
            "key", m.getKeys(),
            "topic", m.getTopic(),
            "tags", m.getTags(),
            "queueId", m.getQueueId(),
            "queueOffset", m.getQueueOffset(),
            "reconsumeTimes", m.getReconsumeTimes(),
            "msgId", m.getMsgId(),
            "retryTopic", m.getProperty("RETRY_TOPIC"),
            "seq", m.getUserProperty("seq"),
            "order", m.getUserProperty("order"),
            "bornMs", m.getBornTimestamp(),
            "storeMs", m.getStoreTimestamp(),
            "receivedMs", System.currentTimeMillis(),
            "thread", Thread.currentThread().getName(),
            "body", new String(m.getBody(), 0, Math.min(m.getBody().length, 64), StandardCharsets.UTF_8));
    }

    /**
     * Push consumers (--instances of them, one client id each) of one group. --listener concurrent
     * (default) or orderly; --fail-until N makes the listener answer RECONSUME_LATER (orderly:
     * SUSPEND_CURRENT_QUEUE_A_MOMENT) while a message's reconsumeTimes is below N, with
     * --retry-delay-level as delayLevelWhenNextConsume; --max-reconsume sets maxReconsumeTimes.
     */
    static int push(Args args) throws Exception {
        String rebalanceMs = args.str("rebalance-interval-ms", "");
        if (!rebalanceMs.isEmpty()) {
            // Read once when RebalanceService loads: a long interval shows that a rebalance came from
            // the broker's NOTIFY_CONSUMER_IDS_CHANGED, not from the client's own timer.
            System.setProperty("rocketmq.client.rebalance.waitInterval", rebalanceMs);
        }
        int instances = args.integer("instances", 1);
        String listener = args.str("listener", "concurrent");
        int failUntil = args.integer("fail-until", 0);
        int retryLevel = args.integer("retry-delay-level", 0);
        Tally tally = new Tally(args.longer("expect", 1));
        List<DefaultMQPushConsumer> consumers = new ArrayList<>();
        for (int n = 0; n < instances; n++) {
            String name = Producers.instance(args, "consumer") + "-" + n;
            DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(args.str("group"));
            consumer.setNamesrvAddr(args.str("namesrv"));
            consumer.setInstanceName(name);
            consumer.setVipChannelEnabled(false);
            consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
            if ("broadcasting".equals(args.str("model", "clustering"))) {
                consumer.setMessageModel(MessageModel.BROADCASTING);
            }
            if (args.integer("max-reconsume", Integer.MIN_VALUE) != Integer.MIN_VALUE) {
                consumer.setMaxReconsumeTimes(args.integer("max-reconsume", 16));
            }
            consumer.setSuspendCurrentQueueTimeMillis(args.integer("suspend-ms", 1000));
            consumer.subscribe(args.str("topic"), args.str("expression", "*"));
            if ("orderly".equals(listener)) {
                consumer.registerMessageListener((MessageListenerOrderly) (messages, context) -> {
                    for (MessageExt m : messages) {
                        Out.emit(received(name, m));
                    }
                    tally.add(messages.size());
                    boolean fail = messages.stream().anyMatch(m -> m.getReconsumeTimes() < failUntil);
                    return fail ? ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT : ConsumeOrderlyStatus.SUCCESS;
                });
            } else {
                consumer.registerMessageListener((MessageListenerConcurrently) (messages, context) -> {
                    for (MessageExt m : messages) {
                        Out.emit(received(name, m));
                    }
                    tally.add(messages.size());
                    boolean fail = messages.stream().anyMatch(m -> m.getReconsumeTimes() < failUntil);
                    if (!fail) {
                        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
                    }
                    context.setDelayLevelWhenNextConsume(retryLevel);
                    return ConsumeConcurrentlyStatus.RECONSUME_LATER;
                });
            }
            consumers.add(consumer);
        }
        for (DefaultMQPushConsumer consumer : consumers) {
            consumer.start();
        }
        Out.emit(assignments(consumers, args.str("topic"), args.integer("settle-ms", 20_000)));
        if (args.integer("report-ms", 0) > 0) {
            reportOwned(consumers, args.str("topic"), args.integer("report-ms", 100));
        }
        boolean reached = tally.await(args.integer("linger-ms", 2000), args.integer("timeout-ms", 60_000));
        for (DefaultMQPushConsumer consumer : consumers) {
            consumer.shutdown(); // persists the consumed offsets
        }
        Out.emit("event", "done", "received", tally.received.get(), "reached", reached);
        return 0;
    }

    /** The ids of the topic's queues a consumer holds now (its rebalance's process queues), sorted. */
    static List<Integer> queuesOf(DefaultMQPushConsumer consumer, String topic) {
        List<Integer> ids = new ArrayList<>();
        for (MessageQueue mq : consumer.getDefaultMQPushConsumerImpl().getRebalanceImpl()
            .getProcessQueueTable().keySet()) {
            if (mq.getTopic().equals(topic)) {
                ids.add(mq.getQueueId());
            }
        }
        java.util.Collections.sort(ids);
        return ids;
    }

    /** Emits an "owned" event (instance, queue ids, time) whenever a consumer's queues of the topic
     * change, checked every periodMs on a daemon thread. */
    static void reportOwned(List<DefaultMQPushConsumer> consumers, String topic, long periodMs) {
        Thread reporter = new Thread(() -> {
            Map<String, List<Integer>> last = new java.util.HashMap<>();
            while (true) {
                for (DefaultMQPushConsumer consumer : consumers) {
                    List<Integer> ids = queuesOf(consumer, topic);
                    if (!ids.equals(last.get(consumer.getInstanceName()))) {
                        last.put(consumer.getInstanceName(), ids);
                        Out.emit("event", "owned", "instance", consumer.getInstanceName(), "queues", ids,
                            "atMs", System.currentTimeMillis());
                    }
                }
                try {
                    Thread.sleep(periodMs);
                } catch (InterruptedException e) {
                    return;
                }
            }
        }, "owned-reporter");
        reporter.setDaemon(true);
        reporter.start();
    }

    /**
     * Waits until the consumers' rebalance covers each queue of the topic exactly once (clustering) or
     * once per consumer (broadcasting), each consumer holding some, or --settle-ms; the "started"
     * event names each one's queues.
     */
    static Map<String, Object> assignments(List<DefaultMQPushConsumer> consumers, String topic, long settleMs)
        throws Exception {
        int queues = consumers.get(0).fetchSubscribeMessageQueues(topic).size();
        boolean broadcasting = consumers.get(0).getMessageModel() == MessageModel.BROADCASTING;
        int wanted = broadcasting ? queues * consumers.size() : queues;
        long deadline = System.currentTimeMillis() + settleMs;
        Map<String, Object> owned = new java.util.TreeMap<>();
        boolean settled = false;
        while (!settled && System.currentTimeMillis() < deadline) {
            owned.clear();
            java.util.Set<Integer> distinct = new java.util.HashSet<>();
            int total = 0;
            boolean everyoneHasSome = true;
            for (DefaultMQPushConsumer consumer : consumers) {
                List<Integer> ids = queuesOf(consumer, topic);
                distinct.addAll(ids);
                total += ids.size();
                everyoneHasSome &= !ids.isEmpty() || consumers.size() > queues;
                owned.put(consumer.getInstanceName(), ids);
            }
            settled = total == wanted && distinct.size() == queues && everyoneHasSome;
            if (!settled) {
                Thread.sleep(100);
            }
        }
        return Out.obj("event", "started", "queues", queues, "settled", settled, "assignments", owned);
    }

    /** DefaultLitePullConsumer, --mode subscribe (rebalanced) or assign (every queue, from offset 0),
     * commitSync after each poll; reports the committed offsets at the end. */
    static int lite(Args args) throws Exception {
        String mode = args.str("mode", "subscribe");
        String topic = args.str("topic");
        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer(args.str("group"));
        consumer.setNamesrvAddr(args.str("namesrv"));
        consumer.setInstanceName(Producers.instance(args, "lite"));
        consumer.setVipChannelEnabled(false);
        consumer.setAutoCommit(false);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.setPullBatchSize(args.integer("batch", 32));
        Tally tally = new Tally(args.longer("expect", 1));
        Collection<MessageQueue> queues = List.of();
        if ("subscribe".equals(mode)) {
            consumer.subscribe(topic, args.str("expression", "*"));
            consumer.start();
        } else if ("assign".equals(mode)) {
            consumer.start();
            queues = consumer.fetchMessageQueues(topic);
            consumer.assign(queues);
            for (MessageQueue queue : queues) {
                consumer.seek(queue, 0);
            }
        } else {
            throw new IllegalArgumentException("unknown lite mode " + mode);
        }
        String name = consumer.getInstanceName();
        long deadline = System.currentTimeMillis() + args.integer("timeout-ms", 60_000);
        long lingerMs = args.integer("linger-ms", 1000);
        while (System.currentTimeMillis() < deadline) {
            List<MessageExt> batch = consumer.poll(200);
            for (MessageExt m : batch) {
                Out.emit(received(name, m));
            }
            if (!batch.isEmpty()) {
                tally.add(batch.size());
                consumer.commitSync();
            } else if (tally.received.get() >= tally.expect
                && System.currentTimeMillis() - tally.lastAt.get() >= lingerMs) {
                break;
            }
        }
        for (MessageQueue queue : queues) {
            Out.emit("event", "committed", "queueId", queue.getQueueId(), "offset", consumer.committed(queue));
        }
        consumer.shutdown(); // persists the committed offsets to the broker
        Out.emit("event", "done", "received", tally.received.get(), "reached", tally.received.get() >= tally.expect);
        return 0;
    }
}
