// A smoke test of lakemq's RocketMQ endpoint with the unmodified Apache RocketMQ 4.9.x Java client.
// Run: java -cp <rocketmq-client jars> Smoke.java <namesrv> <topic> <count> [bodies sent by others, comma separated]
// Sends <count> messages (sync, tags TagA/TagB, keys) plus a batch of 3, then pulls them back with
// DefaultLitePullConsumer and a DefaultMQPushConsumer subscribed "TagA || TagB", and prints one line
// per fact the pytest wrapper checks ("SENT", "BATCH", "PUSHED", "PULLED", "OK").
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;

public class Smoke {
    public static void main(String[] args) throws Exception {
        String namesrv = args[0];
        String topic = args[1];
        int count = Integer.parseInt(args[2]);
        Set<String> sent = ConcurrentHashMap.newKeySet();
        if (args.length > 3) {
            for (String body : args[3].split(",")) {
                sent.add(body);  // sent by someone else (a Python producer): must arrive too
            }
        }

        DefaultMQProducer producer = new DefaultMQProducer("SmokeProducers");
        producer.setNamesrvAddr(namesrv);
        producer.setSendMsgTimeout(10000);
        producer.start();
        for (int i = 0; i < count; i++) {
            String body = "smoke-" + i;
            Message msg = new Message(topic, i % 2 == 0 ? "TagA" : "TagB", "key-" + i, body.getBytes(StandardCharsets.UTF_8));
            SendResult r = producer.send(msg);
            sent.add(body);
            System.out.println("SENT " + r.getSendStatus() + " " + r.getMsgId() + " " + r.getOffsetMsgId()
                + " q=" + r.getMessageQueue().getQueueId() + " off=" + r.getQueueOffset());
        }
        List<Message> batch = new ArrayList<>();
        for (int i = 0; i < 3; i++) {
            String body = "batch-" + i;
            batch.add(new Message(topic, "TagA", body.getBytes(StandardCharsets.UTF_8)));
            sent.add(body);
        }
        SendResult br = producer.send(batch);
        System.out.println("BATCH " + br.getSendStatus() + " " + br.getMsgId());
        producer.shutdown();

        Set<String> pushed = ConcurrentHashMap.newKeySet();
        CountDownLatch latch = new CountDownLatch(sent.size());
        DefaultMQPushConsumer push = new DefaultMQPushConsumer("SmokePushGroup");
        push.setNamesrvAddr(namesrv);
        push.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        push.subscribe(topic, "TagA || TagB");
        push.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            for (MessageExt m : msgs) {
                String body = new String(m.getBody(), StandardCharsets.UTF_8);
                if (pushed.add(body)) {
                    latch.countDown();
                }
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        push.start();
        boolean all = latch.await(60, TimeUnit.SECONDS);
        System.out.println("PUSHED " + pushed.size() + " of " + sent.size());
        push.shutdown();

        Set<String> pulled = new java.util.HashSet<>();
        DefaultLitePullConsumer lite = new DefaultLitePullConsumer("SmokeLiteGroup");
        lite.setNamesrvAddr(namesrv);
        lite.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        lite.subscribe(topic, "*");
        lite.start();
        long deadline = System.currentTimeMillis() + 60000;
        while (pulled.size() < sent.size() && System.currentTimeMillis() < deadline) {
            for (MessageExt m : lite.poll(1000)) {
                pulled.add(new String(m.getBody(), StandardCharsets.UTF_8));
            }
        }
        lite.shutdown();
        System.out.println("PULLED " + pulled.size() + " of " + sent.size());
        boolean ok = all && pushed.equals(sent) && pulled.equals(sent);
        System.out.println(ok ? "OK" : "FAILED");
        System.exit(ok ? 0 : 1);
    }
}
