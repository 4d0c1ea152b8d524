package lakemq.rmq5;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Map;
import java.util.TreeMap;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.message.MessageView;

/** What every scenario shares: the client's configuration and a message as a JSON object. */
final class Clients {
    private Clients() {}

    static final ClientServiceProvider PROVIDER = ClientServiceProvider.loadService();

    /** The endpoint of {@code --endpoint}, plain text (the client's default is TLS). */
    static ClientConfiguration config(Args args) {
        return ClientConfiguration.newBuilder()
                .setEndpoints(args.str("endpoint"))
                .enableSsl(false)
                .setRequestTimeout(Duration.ofMillis(args.longer("request-timeout-ms", 10_000)))
                .build();
    }

    static String text(MessageView message) {
        return StandardCharsets.UTF_8.decode(message.getBody().duplicate()).toString();
    }

    static Map<String, Object> describe(MessageView message) {
        return Out.obj(
                "id", message.getMessageId().toString(),
                "topic", message.getTopic(),
                "body", text(message),
                "tag", message.getTag().orElse(null),
                "keys", new ArrayList<>(message.getKeys()),
                "group", message.getMessageGroup().orElse(null),
                "properties", new TreeMap<String, Object>(message.getProperties()),
                "attempt", message.getDeliveryAttempt(),
                "delivery_ms", message.getDeliveryTimestamp().orElse(null));
    }

    static Map<String, Object> event(String kind, MessageView message) {
        Map<String, Object> out = Out.obj("event", kind);
        out.putAll(describe(message));
        return out;
    }
}
