package lakemq.rmq5;

import java.util.HashMap;
import java.util.Map;

/** Command-line options of the form {@code --name value}; every scenario reads its own. */
final class Args {
    private final Map<String, String> values = new HashMap<>();

    static Args parse(String[] argv, int from) {
        Args args = new Args();
        for (int i = from; i < argv.length; i++) {
            String name = argv[i];
            if (!name.startsWith("--") || i + 1 >= argv.length) {
                throw new IllegalArgumentException("expected --name value pairs, got " + name);
            }
            args.values.put(name.substring(2), argv[++i]);
        }
        return args;
    }

    String str(String name) {
        String value = values.get(name);
        if (value == null) {
            throw new IllegalArgumentException("missing option --" + name);
        }
        return value;
    }

    String str(String name, String fallback) {
        return values.getOrDefault(name, fallback);
    }

    int integer(String name, int fallback) {
        String value = values.get(name);
        return value == null ? fallback : Integer.parseInt(value);
    }

    long longer(String name, long fallback) {
        String value = values.get(name);
        return value == null ? fallback : Long.parseLong(value);
    }
}
