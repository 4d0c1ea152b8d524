package lakemq.harness;

import java.nio.charset.StandardCharsets;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.utils.MessageUtil;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * Request-reply (RocketMQ 4.7+): a responder (push consumer plus producer) answers each request
 * with MessageUtil.createReplyMessage; a requester calls DefaultMQProducer.request and reports each
 * reply it got back. The requests carry a flag, so the responder also reports the flag and born host
 * the broker kept.
 */
final class Replies {
    private Replies() {}

    static int run(Args args) throws Exception {
        String topic = args.str("topic");
        int count = args.integer("count", 5);
        DefaultMQProducer replier = new DefaultMQProducer(args.str("group") + "Replier");
        Producers.configure(replier, args);
        replier.setInstanceName(Producers.instance(args, "replier"));
        replier.start();
        DefaultMQPushConsumer responder = new DefaultMQPushConsumer(args.str("group"));
        responder.setNamesrvAddr(args.str("namesrv"));
        responder.setInstanceName(Producers.instance(args, "responder"));
        responder.setVipChannelEnabled(false);
        responder.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET); // requests sent before its first rebalance too
        responder.subscribe(topic, "*");
        AtomicBoolean closing = new AtomicBoolean();
        responder.registerMessageListener((MessageListenerConcurrently) (messages, context) -> {
            for (MessageExt request : messages) {
                Out.emit(
                    "event", "request", "body", new String(request.getBody(), StandardCharsets.UTF_8),
                    "flag", request.getFlag(), "bornHost", String.valueOf(request.getBornHost()),
                    "cluster", request.getProperty("CLUSTER"));
                try {
                    byte[] answer = ("re:" + new String(request.getBody(), StandardCharsets.UTF_8))
                        .getBytes(StandardCharsets.UTF_8);
                    replier.send(MessageUtil.createReplyMessage(request, answer));
                } catch (Exception e) {
                    if (!closing.get()) { // a reply cut off by the shutdown below is not a failure
                        Out.emit("event", "reply_failed", "error", String.valueOf(e));
                    }
                }
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        responder.start();

        DefaultMQProducer requester = new DefaultMQProducer(args.str("group") + "Requester");
        Producers.configure(requester, args);
        requester.setInstanceName(Producers.instance(args, "requester"));
        requester.start();
        Producers.awaitRoute(requester, args);
        Thread.sleep(args.integer("settle-ms", 3000)); // the responder's first rebalance
        for (int i = 0; i < count; i++) {
            Message request = new Message(topic, ("ask-" + i).getBytes(StandardCharsets.UTF_8));
            request.setFlag(40 + i);
            try {
                Message reply = requester.request(request, args.integer("request-timeout-ms", 15_000));
                Out.emit(
                    "event", "reply", "body", new String(reply.getBody(), StandardCharsets.UTF_8),
                    "topic", reply.getTopic());
            } catch (Exception e) {
                Out.emit("event", "request_failed", "error", String.valueOf(e));
            }
        }
        closing.set(true);
        requester.shutdown();
        responder.shutdown();
        replier.shutdown();
        return 0;
    }
}
