"""kafka-python settings from Kafka (Java) client properties, and the ``pystatefun.*``
properties of the Kafka ingress and egress (docs/kafka.md)."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from statefun._exceptions import ConfigurationError

__all__ = [
    "DEAD_LETTER_TOPIC",
    "DISCOVERY_INTERVAL",
    "JSON_VALUE_TYPES",
    "interval_ms",
    "kafka_client_config",
]

log = logging.getLogger(__name__)

#: Property: the topic that receives records the ingress (or egress) cannot handle.
DEAD_LETTER_TOPIC = "pystatefun.dead-letter.topic"
#: Property: valueTypes (comma-separated; ``*``: every one that is not built in) whose values
#: must be JSON text; a record whose value is not is a dead letter, not a message.
JSON_VALUE_TYPES = "pystatefun.json-value-types"
#: Property: how often to look for new partitions and for topics that did not exist yet.
DISCOVERY_INTERVAL = "pystatefun.partition-discovery.interval.ms"


_JAAS_USER = re.compile(r'username\s*=\s*"([^"]*)"')
_JAAS_PASSWORD = re.compile(r'password\s*=\s*"([^"]*)"')
# kafka-python settings that take objects, not text: never from properties.
_OBJECT_KEYS = {"key_deserializer", "value_deserializer", "key_serializer", "value_serializer"}
_INT_KEYS = {"receive_buffer_bytes", "send_buffer_bytes"}


def kafka_client_config(
    properties: Mapping[str, str], defaults: Mapping[str, Any], *, owner: str, warn: bool = True
) -> dict[str, Any]:
    """kafka-python settings from Kafka (Java) client properties.

    ``security.protocol`` becomes ``security_protocol`` and so on, converted to the type of
    kafka-python's default; ``sasl.jaas.config`` gives the PLAIN/SCRAM user name and password.
    ``pystatefun.*`` properties and names kafka-python does not know are left out (the latter
    with a warning that names the property). Values are never logged: they may be secrets.
    """
    config: dict[str, Any] = {}
    for name, text in properties.items():
        if name.startswith("pystatefun."):
            continue
        if name == "sasl.jaas.config":
            user, password = _JAAS_USER.search(text), _JAAS_PASSWORD.search(text)
            if user and password:
                config["sasl_plain_username"] = user.group(1)
                config["sasl_plain_password"] = password.group(1)
            elif warn:
                log.warning(
                    '%s: property sasl.jaas.config: only username="..." password="..." '
                    "(PLAIN, SCRAM) is understood; ignored",
                    owner,
                )
            continue
        key = name.replace(".", "_").replace("-", "_")
        default = defaults.get(key, ...)
        settable = default is None or isinstance(default, str | int | float)
        if key in _OBJECT_KEYS or default is ... or not settable:
            if warn:
                log.warning("%s: Kafka property %s is not supported here; ignored", owner, name)
            continue
        try:
            config[key] = _coerce(key, text, default)
        except ValueError:
            kind = "true or false" if isinstance(default, bool) else "a number"
            raise ConfigurationError(f"{owner}: Kafka property {name}: expected {kind}") from None
    return config


def librdkafka_config(
    properties: Mapping[str, str],
    choice: str,
    names: Mapping[str, str],
    ignored: frozenset[str],
    config: dict[str, Any],
    owner: str,
) -> dict[str, Any] | str:
    """``config`` with the properties librdkafka takes added under its ``names`` for them, or
    why kafka-python is the client instead: the property ``choice`` says so, or a property
    (other than ``pystatefun.*``, the ``ignored`` ones, plain ``security.protocol``) has no
    librdkafka name here (TLS, SASL, ...)."""
    chosen = properties.get(choice, "librdkafka").strip()
    if chosen not in ("librdkafka", "kafka-python"):
        raise ConfigurationError(f"{owner}: property {choice}: expected librdkafka or kafka-python")
    if chosen == "kafka-python":
        return f"property {choice} is kafka-python"
    for name, value in properties.items():
        if name.startswith("pystatefun.") or name in ignored:
            continue
        if name == "security.protocol" and value.strip().upper() == "PLAINTEXT":
            continue
        target = names.get(name)
        if target is None:
            return f"property {name} is not handed to librdkafka"
        config[target] = value
    return config


def _coerce(key: str, text: str, default: Any) -> Any:
    if key == "acks":
        return "all" if text.strip().lower() == "all" else int(text)
    if key == "compression_type":
        return None if text.strip().lower() == "none" else text
    if isinstance(default, bool):
        lowered = text.strip().lower()
        if lowered not in ("true", "false"):
            raise ValueError(text)
        return lowered == "true"
    if isinstance(default, int) or key in _INT_KEYS:
        return int(text)
    if isinstance(default, float):
        try:
            return int(text)
        except ValueError:
            return float(text)
    return text


def interval_ms(properties: Mapping[str, str], name: str, default: int, owner: str) -> int:
    text = properties.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigurationError(f"{owner}: property {name}: expected milliseconds > 0")
    return value
