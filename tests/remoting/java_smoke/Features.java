// lakemq's RocketMQ endpoint against more of the unmodified 4.9.x Java client: async, oneway and
// delayed sends, an orderly consumer (queue locks), RECONSUME_LATER -> retry, a transactional
// producer (commit, rollback, and UNKNOWN decided by the check-back), viewMessage and queryMessage.
// Run: java -cp <rocketmq-client jars> Features.java <namesrv> <topic>
// Prints one "CHECK <name> <ok|FAILED> <detail>" line per feature, then "OK" or "FAILED".
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.MessageSelector;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.SendCallback;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.QueryResult;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;

public class Features {
    static boolean allOk = true;

    static void check(String name, boolean ok, String detail) {
        allOk &= ok;
        System.out.println("CHECK " + name + " " + (ok ? "ok" : "FAILED") + " " + detail);
    }

    static Message msg(String topic, String tag, String key, String body) {
        return new Message(topic, tag, key, body.getBytes(StandardCharsets.UTF_8));
    }

    static String body(MessageExt m) {
        return new String(m.getBody(), StandardCharsets.UTF_8);
    }

    public static void main(String[] args) throws Exception {
        String namesrv = args[0];
        String topic = args[1];

        // ---- async, oneway, delayed sends; view and query
        DefaultMQProducer producer = new DefaultMQProducer("FeatureProducers");
        producer.setNamesrvAddr(namesrv);
        producer.setSendMsgTimeout(10000);
        producer.start();
        CountDownLatch asyncDone = new CountDownLatch(1);
        List<SendResult> asyncResult = new ArrayList<>();
        producer.send(msg(topic, "Async", "k-async", "async"), new SendCallback() {
            public void onSuccess(SendResult r) { asyncResult.add(r); asyncDone.countDown(); }
            public void onException(Throwable e) { e.printStackTrace(); asyncDone.countDown(); }
        });
        check("async-send", asyncDone.await(30, TimeUnit.SECONDS) && asyncResult.size() == 1, "" + asyncResult);
        producer.sendOneway(msg(topic, "Oneway", "k-oneway", "oneway"));
        Message delayed = msg(topic, "Delayed", "k-delayed", "delayed");
        delayed.setDelayTimeLevel(1);
        SendResult delayedResult = producer.send(delayed);
        check("delayed-send", delayedResult.getSendStatus().name().equals("SEND_OK"), delayedResult.toString());
        SendResult viewable = producer.send(msg(topic, "View", "k-view", "viewable"));
        MessageExt viewed = producer.viewMessage(viewable.getOffsetMsgId());
        check("view-message", body(viewed).equals("viewable"), viewed.getMsgId());
        QueryResult found = null;
        for (int i = 0; i < 50 && (found == null || found.getMessageList().isEmpty()); i++) {
            try {
                found = producer.queryMessage(topic, "k-view", 32, 0, System.currentTimeMillis() + 60000);
            } catch (Exception e) {
                Thread.sleep(200);  // the index job has not indexed it yet
            }
        }
        check("query-by-key", found != null && found.getMessageList().size() == 1
            && body(found.getMessageList().get(0)).equals("viewable"), "" + (found == null ? null : found.getMessageList().size()));

        // ---- a concurrent consumer that fails "retry-me" once: it comes back from %RETRY%
        Set<String> want = Set.of("async", "oneway", "delayed", "viewable", "retry-me");
        producer.send(msg(topic, "Retry", "k-retry", "retry-me"));
        Map<String, Integer> seen = new ConcurrentHashMap<>();
        CountDownLatch concurrent = new CountDownLatch(1);
        DefaultMQPushConsumer push = new DefaultMQPushConsumer("FeatureConsumers");
        push.setNamesrvAddr(namesrv);
        push.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        push.subscribe(topic, "*");
        push.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            for (MessageExt m : msgs) {
                String b = body(m);
                seen.merge(b, 1, Integer::sum);
                if (b.equals("retry-me") && m.getReconsumeTimes() == 0) {
                    return ConsumeConcurrentlyStatus.RECONSUME_LATER;
                }
                if (seen.keySet().containsAll(want) && seen.getOrDefault("retry-me", 0) >= 2) {
                    concurrent.countDown();
                }
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        push.start();
        boolean retried = concurrent.await(120, TimeUnit.SECONDS);
        check("push-and-retry", retried, seen.toString());
        push.shutdown();

        // ---- orderly: one queue, in order, under a broker lock
        List<String> ordered = new ArrayList<>();
        for (int i = 0; i < 5; i++) {
            producer.send(msg(topic, "Ordered", "k-o" + i, "ordered-" + i), (mqs, m, arg) -> mqs.get(0), null);
        }
        CountDownLatch orderlyDone = new CountDownLatch(5);
        DefaultMQPushConsumer orderly = new DefaultMQPushConsumer("FeatureOrderly");
        orderly.setNamesrvAddr(namesrv);
        orderly.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        orderly.subscribe(topic, "Ordered");
        orderly.registerMessageListener((MessageListenerOrderly) (msgs, ctx) -> {
            for (MessageExt m : msgs) {
                synchronized (ordered) { ordered.add(body(m)); }
                orderlyDone.countDown();
            }
            return ConsumeOrderlyStatus.SUCCESS;
        });
        orderly.start();
        boolean inOrder = orderlyDone.await(90, TimeUnit.SECONDS);
        check("orderly", inOrder && ordered.subList(0, 5).equals(List.of("ordered-0", "ordered-1", "ordered-2", "ordered-3", "ordered-4")), ordered.toString());
        orderly.shutdown();
        producer.shutdown();

        // ---- SQL92: only the message whose property matches
        Message low = msg(topic, "Sql", "k-sql1", "sql-low");
        low.putUserProperty("n", "1");
        Message high = msg(topic, "Sql", "k-sql2", "sql-high");
        high.putUserProperty("n", "7");
        DefaultMQProducer sqlProducer = new DefaultMQProducer("FeatureSqlProducers");
        sqlProducer.setNamesrvAddr(namesrv);
        sqlProducer.start();
        sqlProducer.send(low);
        sqlProducer.send(high);
        sqlProducer.shutdown();
        Set<String> sqlSeen = ConcurrentHashMap.newKeySet();
        CountDownLatch sqlDone = new CountDownLatch(1);
        DefaultMQPushConsumer sql = new DefaultMQPushConsumer("FeatureSql");
        sql.setNamesrvAddr(namesrv);
        sql.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        sql.subscribe(topic, MessageSelector.bySql("n > 5"));
        sql.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            for (MessageExt m : msgs) {
                sqlSeen.add(body(m));
                if (body(m).equals("sql-high")) {
                    sqlDone.countDown();
                }
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        sql.start();
        boolean sqlOk = sqlDone.await(60, TimeUnit.SECONDS);
        Thread.sleep(1000);
        check("sql92", sqlOk && sqlSeen.equals(Set.of("sql-high")), sqlSeen.toString());
        sql.shutdown();

        // ---- transactions
        String txTopic = topic;
        TransactionMQProducer tx = new TransactionMQProducer("FeatureTx");
        tx.setNamesrvAddr(namesrv);
        Set<String> checked = ConcurrentHashMap.newKeySet();
        tx.setTransactionListener(new TransactionListener() {
            public LocalTransactionState executeLocalTransaction(Message m, Object arg) {
                return LocalTransactionState.valueOf((String) arg);
            }
            public LocalTransactionState checkLocalTransaction(MessageExt m) {
                checked.add(body(m));
                return LocalTransactionState.COMMIT_MESSAGE;
            }
        });
        tx.start();
        tx.sendMessageInTransaction(msg(txTopic, "Tx", "k-tx1", "tx-commit"), "COMMIT_MESSAGE");
        tx.sendMessageInTransaction(msg(txTopic, "Tx", "k-tx2", "tx-rollback"), "ROLLBACK_MESSAGE");
        tx.sendMessageInTransaction(msg(txTopic, "Tx", "k-tx3", "tx-unknown"), "UNKNOW");
        Set<String> txSeen = ConcurrentHashMap.newKeySet();
        CountDownLatch txDone = new CountDownLatch(2);
        DefaultMQPushConsumer txc = new DefaultMQPushConsumer("FeatureTxReaders");
        txc.setNamesrvAddr(namesrv);
        txc.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        txc.subscribe(txTopic, "Tx");
        txc.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            for (MessageExt m : msgs) {
                if (txSeen.add(body(m))) {
                    txDone.countDown();
                }
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        txc.start();
        boolean txOk = txDone.await(120, TimeUnit.SECONDS);
        Thread.sleep(2000);  // a rolled-back message would show up by now
        check("transactions", txOk && txSeen.equals(Set.of("tx-commit", "tx-unknown")) && checked.contains("tx-unknown"),
            "seen=" + txSeen + " checked=" + checked);
        txc.shutdown();
        tx.shutdown();

        System.out.println(allOk ? "OK" : "FAILED");
        System.exit(allOk ? 0 : 1);
    }
}
