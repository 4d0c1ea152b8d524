package lakemq.harness;

/**
 * Scenarios of the unmodified Apache RocketMQ client, one per run:
 *
 * <pre>
 *   java -cp ... lakemq.harness.Main produce --mode sync|async|oneway|batch|ordered|delay --namesrv H:P --topic T ...
 *   java -cp ... lakemq.harness.Main transaction --namesrv H:P --topic T --group G --count N
 *   java -cp ... lakemq.harness.Main push --namesrv H:P --topic T --group G --expect N [--model broadcasting]
 *   java -cp ... lakemq.harness.Main lite --mode subscribe|assign --namesrv H:P --topic T --group G --expect N
 *   java -cp ... lakemq.harness.Main bench --namesrv H:P --topic T --group G --messages N --threads T
 * </pre>
 *
 * Results are JSON lines on standard output; the exit code is 0 when the scenario ran to its end
 * (what it saw is for the caller to judge), 1 when it failed and 2 on a usage error.
 */
public final class Main {
    private Main() {}

    public static void main(String[] argv) throws Exception {
        if (argv.length == 0) {
            System.err.println("usage: Main produce|transaction|push|lite|bench|reply --option value ...");
            System.exit(2);
        }
        int code;
        try {
            Args args = Args.parse(argv, 1);
            code = switch (argv[0]) {
                case "produce" -> Producers.produce(args);
                case "transaction" -> Producers.transaction(args);
                case "push" -> Consumers.push(args);
                case "lite" -> Consumers.lite(args);
                case "bench" -> Bench.run(args);
                case "reply" -> Replies.run(args);
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
