package lakemq.rmq5;

/**
 * Scenarios of the unmodified Apache RocketMQ 5.x Java client (rocketmq-client-java), one per run,
 * against a RocketMQ 5 gRPC endpoint (lakemq's {@code mq serve --grpc}, or RocketMQ's own proxy):
 *
 * <pre>
 *   java -cp ... lakemq.rmq5.Main produce --endpoint H:P --topic T --count N [--kind normal|delay|fifo]
 *        [--delay-ms D] [--groups G] [--prefix P]
 *   java -cp ... lakemq.rmq5.Main transaction --endpoint H:P --topic T --count N [--check-wait-ms W]
 *   java -cp ... lakemq.rmq5.Main simple --endpoint H:P --topic T --group G --expect N [--mode ack|retry|change]
 *   java -cp ... lakemq.rmq5.Main push --endpoint H:P --topic T --group G --expect N [--fail-first true]
 * </pre>
 *
 * Results are JSON lines on standard output (logs go to {@code ~/logs}, ~ being the caller's log
 * directory); the exit code is 0 when the scenario ran to its end (what it saw is for the caller to
 * judge), 1 when it failed and 2 on a usage error.
 */
public final class Main {
    private Main() {}

    public static void main(String[] argv) throws Exception {
        if (argv.length == 0) {
            System.err.println("usage: Main produce|transaction|simple|push --option value ...");
            System.exit(2);
        }
        int code;
        try {
            Args args = Args.parse(argv, 1);
            code = switch (argv[0]) {
                case "produce" -> Producers.produce(args);
                case "transaction" -> Producers.transaction(args);
                case "simple" -> Consumers.simple(args);
                case "push" -> Consumers.push(args);
                default -> throw new IllegalArgumentException("unknown scenario " + argv[0]);
            };
        } catch (IllegalArgumentException e) {
            System.err.println("usage error: " + e.getMessage());
            code = 2;
        } catch (Throwable e) {
            e.printStackTrace();
            Out.emit("event", "error", "error", String.valueOf(e));
            code = 1;
        }
        System.exit(code); // the client leaves non-daemon threads behind
    }
}
