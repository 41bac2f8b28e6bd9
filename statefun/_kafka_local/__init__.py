"""A local Apache Kafka broker for development: ``statefun kafka start``.

``broker.py`` runs a single-node Kafka 4.x broker (KRaft) on 127.0.0.1 from jars that Maven
fetches from Maven Central once (``_jars.py``; the list is ``pom.xml``, shipped with the
package) and waits until it answers (``_probe.py``); ``_command.py`` is the ``statefun kafka``
subcommand. The test suite starts its brokers with
the same code.
"""
