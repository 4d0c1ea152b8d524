package lakemq.harness;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;

/**
 * The wire benchmark, the same for every broker it is pointed at: sync sends from --threads threads
 * (each send's latency), batches of --batch-size from the same threads, then one push consumer
 * reading everything back. Prints one "phase" line per part with the raw figures.
 */
final class Bench {
    private Bench() {}

    interface Sender {
        int send(int thread, int i) throws Exception;
    }

    /** Runs {@code perThread} calls on each of {@code threads} threads; returns wall seconds. */
    static double parallel(int threads, int perThread, Sender sender, AtomicLong failures) throws Exception {
        CountDownLatch start = new CountDownLatch(1);
        List<Thread> workers = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            int thread = t;
            Thread worker = new Thread(() -> {
                try {
                    start.await();
                    for (int i = 0; i < perThread; i++) {
                        try {
                            failures.addAndGet(sender.send(thread, i));
                        } catch (Exception e) {
                            failures.incrementAndGet();
                            System.err.println("send failed: " + e);
                        }
                    }
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            });
            worker.start();
            workers.add(worker);
        }
        long began = System.nanoTime();
        start.countDown();
        for (Thread worker : workers) {
            worker.join();
        }
        return (System.nanoTime() - began) / 1e9;
    }

    static int run(Args args) throws Exception {
        String topic = args.str("topic");
        int threads = args.integer("threads", 4);
        int syncPerThread = args.integer("sync-messages", 2000) / threads;
        int batchSize = args.integer("batch-size", 32);
        int batchesPerThread = args.integer("batch-messages", 20_000) / batchSize / threads;
        byte[] body = Producers.body("bench", args.integer("body-bytes", 1024));
        DefaultMQProducer producer = new DefaultMQProducer(args.str("group") + "Producer");
        Producers.configure(producer, args);
        producer.start();
        Producers.awaitRoute(producer, args);
        // Warm up: routes, connections, the JIT; not measured. A busy broker may refuse a send
        // (RocketMQ's flow control answers SYSTEM_BUSY): try again, at most 10 times per message.
        int warmup = args.integer("warmup", 50);
        for (int i = 0, refused = 0; i < warmup; ) {
            try {
                producer.send(new Message(topic, "warm", body));
                i++;
            } catch (Exception e) {
                if (++refused > 10 * warmup) {
                    throw e;
                }
                Thread.sleep(100);
            }
        }
        long sent = warmup;
        Out.emit("event", "warm", "messages", warmup); // the measured phases start now


        ConcurrentLinkedQueue<Double> latencies = new ConcurrentLinkedQueue<>();
        AtomicLong failures = new AtomicLong();
        double syncSeconds = parallel(threads, syncPerThread, (thread, i) -> {
            long began = System.nanoTime();
            SendStatus status = producer.send(new Message(topic, "sync", body)).getSendStatus();
            latencies.add((System.nanoTime() - began) / 1e6);
            return status == SendStatus.SEND_OK ? 0 : 1;
        }, failures);
        sent += (long) syncPerThread * threads;
        Out.emit(
            "event", "phase", "phase", "sync", "messages", syncPerThread * threads, "seconds", syncSeconds,
            "threads", threads, "failures", failures.get(), "latencies_ms", new ArrayList<>(latencies));

        failures.set(0);
        double batchSeconds = parallel(threads, batchesPerThread, (thread, i) -> {
            List<Message> batch = new ArrayList<>(batchSize);
            for (int j = 0; j < batchSize; j++) {
                batch.add(new Message(topic, "batch", body));
            }
            return producer.send(batch).getSendStatus() == SendStatus.SEND_OK ? 0 : batchSize;
        }, failures);
        int batchMessages = batchesPerThread * threads * batchSize;
        sent += batchMessages;
        Out.emit(
            "event", "phase", "phase", "batch", "messages", batchMessages, "seconds", batchSeconds,
            "threads", threads, "batchSize", batchSize, "failures", failures.get());
        producer.shutdown();

        AtomicLong consumed = new AtomicLong();
        AtomicLong lastAt = new AtomicLong();
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(args.str("group"));
        consumer.setNamesrvAddr(args.str("namesrv"));
        consumer.setInstanceName(Producers.instance(args, "bench-consumer"));
        consumer.setVipChannelEnabled(false);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.setConsumeMessageBatchMaxSize(32);
        consumer.setPullBatchSize(32);
        consumer.subscribe(topic, "*");
        consumer.registerMessageListener((MessageListenerConcurrently) (messages, context) -> {
            consumed.addAndGet(messages.size());
            lastAt.set(System.nanoTime());
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        long began = System.nanoTime();
        consumer.start();
        long deadline = System.currentTimeMillis() + args.integer("consume-timeout-ms", 120_000);
        while (consumed.get() < sent && System.currentTimeMillis() < deadline) {
            Thread.sleep(20);
        }
        consumer.shutdown();
        double consumeSeconds = Math.max(lastAt.get() - began, 1) / 1e9;
        Out.emit(
            "event", "phase", "phase", "consume", "messages", consumed.get(), "expected", sent,
            "seconds", consumeSeconds);
        return 0;
    }
}
