package peer;

import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import org.apache.flink.statefun.flink.harness.Harness;

/**
 * Runs the StateFun 3.3.0 JVM runtime in a local Flink MiniCluster.
 *
 * <p>Usage: {@code StatefunJvmPeer path/to/module.yaml [flink.key=value ...]}. Every extra
 * argument is a Flink / StateFun configuration entry (run.sh passes sane defaults).
 */
public final class StatefunJvmPeer {
  public static void main(String[] args) throws Exception {
    if (args.length < 1) {
      System.err.println("usage: StatefunJvmPeer MODULE_YAML [key=value ...]");
      System.exit(2);
    }
    Path module = Paths.get(args[0]).toAbsolutePath().normalize();
    if (!Files.isReadable(module)) {
      System.err.println("module.yaml not readable: " + module);
      System.exit(2);
    }
    Harness harness = new Harness();
    // StateFun reads the remote module from this option (default: classpath:module.yaml).
    harness.withConfiguration("statefun.remote.module-name", module.toUri().toString());
    for (int i = 1; i < args.length; i++) {
      int eq = args[i].indexOf('=');
      if (eq <= 0) {
        System.err.println("expected key=value, got: " + args[i]);
        System.exit(2);
      }
      harness.withConfiguration(args[i].substring(0, eq), args[i].substring(eq + 1));
    }
    harness.start(); // blocks while the streaming job runs
  }
}
