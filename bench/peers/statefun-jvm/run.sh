#!/usr/bin/env bash
# Start the reference Apache Flink StateFun 3.3.0 JVM runtime (Flink 1.16.2) in a local
# MiniCluster, serving the given module.yaml.
#
#   bench/peers/statefun-jvm/run.sh path/to/module.yaml [flink.key=value ...]
#
# Extra key=value arguments are Flink / StateFun configuration entries; they override the
# defaults below. Environment knobs (defaults in brackets):
#   STATEFUN_JAVA_HOME        JDK to use [/usr/lib/jvm/java-17-openjdk-amd64, else $JAVA_HOME]
#   STATEFUN_HEAP             JVM -Xmx [1g]
#   STATEFUN_PARALLELISM      job parallelism [1]
#   STATEFUN_CHECKPOINT_MS    checkpoint interval in ms, exactly-once [1000]
#   STATEFUN_STATE_BACKEND    hashmap | rocksdb [hashmap]
#   STATEFUN_CHECKPOINT_DIR   checkpoint storage folder [$TMPDIR/statefun-jvm-checkpoints-<pid>]
#   STATEFUN_REST_PORT        Flink REST/web port on 127.0.0.1, 0 = any free port [0]
#   STATEFUN_LOG_LEVEL        log4j2 root level [INFO]
#   STATEFUN_JAVA_OPTS        extra JVM options
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if [[ $# -lt 1 || "$1" == -h || "$1" == --help ]]; then
  sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
module="$(realpath -e "$1")"
shift

java_home="${STATEFUN_JAVA_HOME:-}"
if [[ -z "$java_home" ]]; then
  if [[ -x /usr/lib/jvm/java-17-openjdk-amd64/bin/java ]]; then
    java_home=/usr/lib/jvm/java-17-openjdk-amd64
  else
    java_home="${JAVA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")}"
  fi
fi
java="$java_home/bin/java"

# Build once; rebuild only when pom.xml or the launcher sources change. A lock serializes
# runs that start at the same time (tests in parallel): one builds, the others wait for it.
stamp="$here/target/.built"
mkdir -p "$here/target"
exec 9>"$here/target/.build.lock"
flock 9
if [[ ! -f "$stamp" || -n "$(find "$here/pom.xml" "$here/src" -newer "$stamp" -print -quit)" ]]; then
  echo "statefun-jvm: building (mvn package) ..." >&2
  (cd "$here" && JAVA_HOME="$java_home" mvn -q -B package -DskipTests >&2)
  touch "$stamp"
fi
flock -u 9
exec 9>&-

# Flink 1.16 (closure cleaner, Kryo, serializers, netty) reflects into JDK internals;
# on Java 17 these packages must be opened, otherwise job translation fails with
# InaccessibleObjectException. This is the set Flink itself ships for Java 17.
jvm_flags=(
  --add-exports=java.base/sun.net.util=ALL-UNNAMED
  --add-exports=java.rmi/sun.rmi.registry=ALL-UNNAMED
  --add-exports=java.security.jgss/sun.security.krb5=ALL-UNNAMED
  --add-opens=java.base/java.lang=ALL-UNNAMED
  --add-opens=java.base/java.lang.reflect=ALL-UNNAMED
  --add-opens=java.base/java.net=ALL-UNNAMED
  --add-opens=java.base/java.io=ALL-UNNAMED
  --add-opens=java.base/java.nio=ALL-UNNAMED
  --add-opens=java.base/sun.nio.ch=ALL-UNNAMED
  --add-opens=java.base/java.text=ALL-UNNAMED
  --add-opens=java.base/java.time=ALL-UNNAMED
  --add-opens=java.base/java.util=ALL-UNNAMED
  --add-opens=java.base/java.util.concurrent=ALL-UNNAMED
  --add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED
  --add-opens=java.base/java.util.concurrent.locks=ALL-UNNAMED
  "-Xmx${STATEFUN_HEAP:-1g}"
  -XX:+UseG1GC
  -Djava.net.preferIPv4Stack=true
  "-Dpeer.log.level=${STATEFUN_LOG_LEVEL:-INFO}"
)
# shellcheck disable=SC2206
jvm_flags+=(${STATEFUN_JAVA_OPTS:-})

conf=(
  "parallelism.default=${STATEFUN_PARALLELISM:-1}"
  # everything on loopback
  rest.bind-address=127.0.0.1
  rest.address=127.0.0.1
  "rest.port=${STATEFUN_REST_PORT:-0}"
  jobmanager.rpc.address=127.0.0.1
  jobmanager.bind-host=127.0.0.1
  taskmanager.host=127.0.0.1
  taskmanager.bind-host=127.0.0.1
  # exactly-once checkpoints (the Kafka egress commits its transactions on checkpoints)
  "execution.checkpointing.interval=${STATEFUN_CHECKPOINT_MS:-1000}ms"
  execution.checkpointing.mode=EXACTLY_ONCE
  "state.backend=${STATEFUN_STATE_BACKEND:-hashmap}"
  # checkpoints on local disk: JobManager memory storage caps a checkpoint at 5 MB, which
  # StateFun's in-flight messages exceed under load (the job then fails and restarts forever)
  state.checkpoint-storage=filesystem
  "state.checkpoints.dir=file://${STATEFUN_CHECKPOINT_DIR:-${TMPDIR:-/tmp}/statefun-jvm-checkpoints-$$}"
  # as in StateFun's own flink-conf.yaml
  restart-strategy=fixed-delay
  restart-strategy.fixed-delay.attempts=2147483647
  restart-strategy.fixed-delay.delay=1s
  "statefun.flink-job-name=StateFun JVM peer ($(basename "$module"))"
)

exec "$java" "${jvm_flags[@]}" -cp "$here/target/classes:$here/target/lib/*" \
  peer.StatefunJvmPeer "$module" "${conf[@]}" "$@"
