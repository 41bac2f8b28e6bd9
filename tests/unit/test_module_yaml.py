"""module.yaml loading: StateFun 3.x kinds with StateFun's meaning, pystatefun kinds, and errors."""

from __future__ import annotations

import logging
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest

from statefun._exceptions import ModuleError
from statefun.module import (
    ASYNC_TRANSPORT,
    OKHTTP_TRANSPORT,
    EmbeddedEndpointSpec,
    FileEgressSpec,
    FileIngressSpec,
    FunctionTarget,
    HttpEndpointSpec,
    HttpIngressSpec,
    KafkaEgressSpec,
    KafkaIngressSpec,
    KafkaTopicSpec,
    ModuleSpec,
    StdoutEgressSpec,
    TransportSpec,
    format_duration,
    load_module,
    load_module_text,
    parse_duration,
)

DATA = Path(__file__).parent / "data" / "modules"
SEC = timedelta(seconds=1)
MIN = timedelta(minutes=1)

ENDPOINT = """
kind: io.statefun.endpoints.v2/http
spec:
  functions: example/*
  urlPathTemplate: http://localhost:8000/{function.name}
"""


def load(text: str) -> ModuleSpec:
    return load_module_text(textwrap.dedent(text))


def transport(text: str) -> TransportSpec:
    (endpoint,) = load(text).endpoints
    assert isinstance(endpoint, HttpEndpointSpec)
    return endpoint.transport


def error(text: str, name: str = "module.yaml") -> str:
    with pytest.raises(ModuleError) as info:
        load_module_text(textwrap.dedent(text), name)
    return str(info.value)


# --------------------------------------------------------------------------- whole files


def test_statefun_file_with_every_field() -> None:
    module = load_module(DATA / "statefun-full.yaml")
    source = str(DATA / "statefun-full.yaml")
    assert module.paths == ((DATA / "statefun-full.yaml").resolve(),)
    assert module.endpoints == (
        HttpEndpointSpec(
            functions=FunctionTarget("shop", None),
            url_path_template="https://functions.shop.example:8443/statefun/{function.name}",
            max_num_batch_requests=500,
            transport=TransportSpec(
                type=ASYNC_TRANSPORT,
                call=3 * MIN,
                connect=5 * SEC,
                read=30 * SEC,
                write=15 * SEC,
                pool_ttl=timedelta(0),
                pool_size=64,
                payload_max_bytes=1048576,
                trust_cacerts="/etc/statefun/ca.pem",
                client_cert="classpath:client.crt",
                client_key="~/client.key",
                client_key_password="/run/secrets/key-password",
            ),
            source=f"{source}, document 1 (io.statefun.endpoints.v2/http)",
        ),
        HttpEndpointSpec(
            functions=FunctionTarget("shop", "checkout"),
            url_path_template="http+unix:///run/checkout.sock/{function.name}",
            transport=TransportSpec(
                type=OKHTTP_TRANSPORT,
                call=MIN,
                connect=2 * SEC,
                read=20 * SEC,
                write=timedelta(milliseconds=100),
            ),
            source=f"{source}, document 2 (io.statefun.endpoints.v2/http)",
        ),
        HttpEndpointSpec(
            functions=FunctionTarget("legacy", None),
            url_path_template="http://legacy:8000/statefun",
            max_num_batch_requests=10,
            transport=TransportSpec(
                type=OKHTTP_TRANSPORT, call=30 * SEC, connect=SEC, read=10 * SEC, write=10 * SEC
            ),
            source=f"{source}, document 3 (io.statefun.endpoints.v1/http)",
        ),
    )
    # document 4 is empty and skipped; numbering still counts it
    assert module.ingresses == (
        KafkaIngressSpec(
            id="shop/orders",
            address="kafka-1:9092,kafka-2:9092",
            consumer_group_id="shop-runtime",
            topics=(
                KafkaTopicSpec("orders", "shop/Order", ("shop/cart", "shop/checkout")),
                KafkaTopicSpec("returns", "io.statefun.types/string", ("shop/returns",)),
            ),
            startup_position="specific-offsets",
            startup_offsets={("orders", 0): 91, ("orders", 1): 11, ("returns", 0): 0},
            auto_offset_reset="earliest",
            properties={
                "max.poll.records": "250",
                "isolation.level": "read_committed",
                "enable.auto.commit": "false",
            },
            source=f"{source}, document 5 (io.statefun.kafka.v1/ingress)",
        ),
    )
    assert module.egresses == (
        KafkaEgressSpec(
            id="shop/receipts",
            address="kafka-1:9092",
            delivery_semantic="exactly-once",
            transaction_timeout=7 * MIN,
            properties={"compression.type": "lz4"},
            source=f"{source}, document 6 (io.statefun.kafka.v1/egress)",
        ),
    )


def test_pystatefun_kinds_with_every_field() -> None:
    module = load_module(DATA / "pystatefun-full.yaml")
    src = str(DATA / "pystatefun-full.yaml")
    assert module.endpoints == (
        EmbeddedEndpointSpec(
            FunctionTarget("example", "greeter"),
            "examples.greeter.functions:functions",
            f"{src}, document 1 (io.pystatefun.endpoints.v1/embedded)",
        ),
    )
    assert module.ingresses == (
        HttpIngressSpec(
            id="example/requests",
            host="0.0.0.0",
            port=9000,
            max_body_bytes=65536,
            reply_timeout=5 * SEC,
            max_pending=100,
            source=f"{src}, document 2 (io.pystatefun.http.v1/ingress)",
        ),
        FileIngressSpec(
            "example/names",
            DATA.resolve() / "input" / "names.jsonl",
            f"{src}, document 3 (io.pystatefun.file.v1/ingress)",
        ),
    )
    assert module.egresses == (
        StdoutEgressSpec("example/console", f"{src}, document 4 (io.pystatefun.stdout.v1/egress)"),
        FileEgressSpec(
            "example/greetings",
            Path("/tmp/greetings.jsonl"),
            source=f"{src}, document 5 (io.pystatefun.file.v1/egress)",
        ),
    )


def test_statefun_30_single_document_format() -> None:
    module = load_module(DATA / "legacy-v30.yaml")
    (endpoint,) = module.endpoints
    assert isinstance(endpoint, HttpEndpointSpec)
    assert endpoint.functions == FunctionTarget("example", None)
    assert endpoint.transport.type == OKHTTP_TRANSPORT
    assert endpoint.source.endswith("legacy-v30.yaml, document 1 (io.statefun.endpoints.v1/http)")
    (ingress,) = module.ingresses
    assert isinstance(ingress, KafkaIngressSpec)
    assert (ingress.id, ingress.consumer_group_id) == ("example/names", "my-group-id")
    (egress,) = module.egresses
    assert isinstance(egress, KafkaEgressSpec)
    assert egress.id == "example/greets"
    assert egress.transaction_timeout == timedelta(milliseconds=100000)


# --------------------------------------------------------------------------- defaults


def test_http_endpoint_defaults_are_statefun_async_transport() -> None:
    (endpoint,) = load_module_text(ENDPOINT).endpoints
    assert isinstance(endpoint, HttpEndpointSpec)
    assert endpoint.max_num_batch_requests == 1000
    assert endpoint.transport == TransportSpec(
        type=ASYNC_TRANSPORT, call=2 * MIN, connect=20 * SEC, read=2 * MIN, write=2 * MIN
    )
    t = endpoint.transport
    assert (t.pool_ttl, t.pool_size, t.payload_max_bytes) == (15 * SEC, 1024, 32 * 1024 * 1024)
    assert t.trust_cacerts is t.client_cert is t.client_key is t.client_key_password is None


def test_transport_without_type_is_async_and_read_defaults_to_call() -> None:
    t = transport(ENDPOINT + "  transport:\n    call: 90s\n")
    assert (t.type, t.call, t.connect, t.read, t.write) == (
        ASYNC_TRANSPORT,
        90 * SEC,
        20 * SEC,
        90 * SEC,
        90 * SEC,
    )


def test_async_nested_timeouts_win_with_their_own_defaults() -> None:
    # As StateFun's async client: a `timeouts` block replaces flat call/connect, 1 min / 10 s.
    text = ENDPOINT + "  transport:\n    call: 5m\n    timeouts:\n      read: 3s\n"
    t = transport(text)
    assert (t.call, t.connect, t.read, t.write) == (MIN, 10 * SEC, 3 * SEC, MIN)


def test_okhttp_defaults() -> None:
    text = ENDPOINT + "  transport:\n    type: io.statefun.transports.v1/okhttp\n"
    t = transport(text)
    assert t == TransportSpec(type=OKHTTP_TRANSPORT)
    assert (t.call, t.connect, t.read, t.write) == (MIN, 10 * SEC, 10 * SEC, 10 * SEC)


def test_kafka_and_pystatefun_defaults() -> None:
    module = load_module_text(
        textwrap.dedent("""
        kind: io.statefun.kafka.v1/ingress
        spec:
          id: a/in
          address: k:9092
          topics: [{topic: t, valueType: a/T, targets: [a/f]}]
        ---
        kind: io.statefun.kafka.v1/egress
        spec: {id: a/out, address: k:9092}
        ---
        kind: io.pystatefun.http.v1/ingress
        spec: {id: a/http}
        """)
    )
    kafka_in, http_in = module.ingresses
    assert isinstance(kafka_in, KafkaIngressSpec)
    assert (kafka_in.startup_position, kafka_in.auto_offset_reset) == ("latest", "latest")
    assert (kafka_in.consumer_group_id, kafka_in.properties) == ("", {})
    assert kafka_in.startup_date is None
    assert kafka_in.startup_timestamp_ms is None
    (kafka_out,) = module.egresses
    assert isinstance(kafka_out, KafkaEgressSpec)
    assert (kafka_out.delivery_semantic, kafka_out.properties) == ("at-least-once", {})
    assert http_in == HttpIngressSpec(
        id="a/http",
        host="127.0.0.1",
        port=8090,
        max_body_bytes=1 << 20,
        reply_timeout=30 * SEC,
        max_pending=10_000,
        source="module.yaml, document 3 (io.pystatefun.http.v1/ingress)",
    )


# --------------------------------------------------------------------------- durations


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10s", 10 * SEC),
        ("2 min", 2 * MIN),
        ("2m", 2 * MIN),
        ("100ms", timedelta(milliseconds=100)),
        ("1minute", MIN),
        ("20seconds", 20 * SEC),
        ("15 sec", 15 * SEC),
        ("3 MIN", 3 * MIN),
        ("1h", timedelta(hours=1)),
        ("2 days", timedelta(days=2)),
        ("250µs", timedelta(microseconds=250)),
        ("1500ns", timedelta(microseconds=1)),
        ("5", timedelta(milliseconds=5)),  # no unit: milliseconds, as Flink
        (1500, timedelta(milliseconds=1500)),  # a YAML integer: its text, so milliseconds
        ("  7 s ", 7 * SEC),
    ],
)
def test_durations_parse_as_flink_does(text: object, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    "text", ["soon", "1.5s", "-1s", "", "s", "10 lightyears", "1 mins", 1.5, True]
)
def test_durations_rejected(text: object) -> None:
    with pytest.raises(ValueError, match="expected a duration such as '10s' or '2 min'"):
        parse_duration(text)


def test_format_duration_round_trips() -> None:
    for duration in (
        2 * MIN,
        90 * SEC,
        timedelta(hours=3),
        timedelta(milliseconds=1),
        timedelta(microseconds=3),
    ):
        assert parse_duration(format_duration(duration)) == duration
    assert format_duration(90 * SEC) == "90s"


# --------------------------------------------------------------------------- resolution


def test_exact_endpoint_wins_over_wildcard_regardless_of_order() -> None:
    module = load_module_text(
        textwrap.dedent("""
        kind: io.statefun.endpoints.v2/http
        spec:
          functions: shop/*
          urlPathTemplate: http://remote:8000/{function.name}
        ---
        kind: io.pystatefun.endpoints.v1/embedded
        spec:
          functions: shop/cart
          module: shop.functions:functions
        ---
        kind: io.statefun.endpoints.v2/http
        spec:
          functions: other/*
          urlPathTemplate: http://other:9000/statefun
        """)
    )
    wildcard, exact, other = module.endpoints
    assert module.endpoint_for("shop/cart") is exact
    assert module.endpoint_for("shop/checkout") is wildcard
    assert module.endpoint_for("other/x") is other
    assert module.endpoint_for("unknown/x") is None
    assert module.endpoint_for("shopping/cart") is None
    assert isinstance(wildcard, HttpEndpointSpec)
    assert wildcard.url_for("shop/checkout") == "http://remote:8000/checkout"
    assert isinstance(other, HttpEndpointSpec)
    assert other.url_for("other/x") == "http://other:9000/statefun"


# --------------------------------------------------------------------------- kafka details


def kafka_ingress(extra: str) -> KafkaIngressSpec:
    text = """
    kind: io.statefun.kafka.v1/ingress
    spec:
      id: a/in
      address: k:9092
      consumerGroupId: g
      topics: [{topic: t, valueType: a/T, targets: [a/f]}]
    """
    (ingress,) = load_module_text(textwrap.dedent(text) + textwrap.indent(extra, "  ")).ingresses
    assert isinstance(ingress, KafkaIngressSpec)
    return ingress


@pytest.mark.parametrize(
    ("date", "millis"),
    [
        ("2020-02-01 04:15:00.00 Z", 1580530500000),  # StateFun's documented example
        ("2020-02-01 04:15:00.000 +0000", 1580530500000),  # StateFun's pattern
        ("2020-02-01 05:15:00.250 +0100", 1580530500250),
        ("2020-02-01 04:15:00 -01:30", 1580535900000),
    ],
)
def test_startup_position_date(date: str, millis: int) -> None:
    ingress = kafka_ingress(f"startupPosition:\n  type: date\n  date: {date}\n")
    assert ingress.startup_position == "date"
    assert (ingress.startup_date, ingress.startup_timestamp_ms) == (date, millis)


@pytest.mark.parametrize("position", ["earliest", "latest", "group-offsets"])
def test_startup_position_simple(position: str) -> None:
    assert kafka_ingress(f"startupPosition: {{type: {position}}}\n").startup_position == position


def test_address_and_group_may_come_from_properties() -> None:
    text = """
    kind: io.statefun.kafka.v1/ingress
    spec:
      id: a/in
      topics: [{topic: t, valueType: a/T, targets: [a/f]}]
      properties:
        - bootstrap.servers: k1:9092
        - group.id: from-props
    """
    (ingress,) = load(text).ingresses
    assert isinstance(ingress, KafkaIngressSpec)
    assert (ingress.address, ingress.consumer_group_id) == ("k1:9092", "from-props")


def test_egress_transaction_timeout_millis_and_other_semantics() -> None:
    base = "kind: io.statefun.kafka.v1/egress\nspec:\n  id: a/out\n  address: k:9092\n"
    millis = base + "  deliverySemantic: {type: exactly-once, transactionTimeoutMillis: 60000}\n"
    (egress,) = load_module_text(millis).egresses
    assert isinstance(egress, KafkaEgressSpec)
    assert egress.transaction_timeout == MIN
    for semantic in ("none", "at-least-once"):
        (egress,) = load_module_text(base + f"  deliverySemantic: {{type: {semantic}}}\n").egresses
        assert isinstance(egress, KafkaEgressSpec)
        assert egress.delivery_semantic == semantic


def test_statefun_kinds_ignore_unknown_fields_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="statefun.module._loader"):
        load_module_text(ENDPOINT + "  colour: blue\n")
    assert (
        "module.yaml, document 1 (io.statefun.endpoints.v2/http): spec.colour: field ignored"
        in caplog.text
    )


# --------------------------------------------------------------------------- files


def test_several_files_are_merged_and_relative_paths_follow_each_file(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "module.yaml").write_text(ENDPOINT)
    (tmp_path / "b.yaml").write_text(
        "kind: io.pystatefun.file.v1/egress\nspec: {id: x/out, path: out/o.jsonl}\n"
    )
    module = load_module(tmp_path / "a", str(tmp_path / "b.yaml"))
    assert module.paths == (
        (tmp_path / "a" / "module.yaml").resolve(),
        (tmp_path / "b.yaml").resolve(),
    )
    assert len(module.endpoints) == 1
    (egress,) = module.egresses
    assert isinstance(egress, FileEgressSpec)
    assert egress.path == (tmp_path / "out" / "o.jsonl").resolve()


def test_missing_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ModuleError, match=f"{missing}: module file not found"):
        load_module(missing)


def test_yaml_syntax_error_names_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("kind: io.statefun.endpoints.v2/http\nspec:\n  functions: [a/b\n  x: 1\n")
    with pytest.raises(ModuleError) as info:
        load_module(path)
    message = str(info.value)
    assert message.startswith(f"{path}, line 4, column 4: invalid YAML: ")


def test_conflicts_across_files_name_both(tmp_path: Path) -> None:
    (tmp_path / "one.yaml").write_text(ENDPOINT)
    (tmp_path / "two.yaml").write_text(ENDPOINT)
    with pytest.raises(ModuleError) as info:
        load_module(tmp_path / "one.yaml", tmp_path / "two.yaml")
    assert str(info.value) == (
        f"{tmp_path / 'two.yaml'}, document 1 (io.statefun.endpoints.v2/http): spec.functions: "
        f"functions 'example/*' are already served by "
        f"{tmp_path / 'one.yaml'}, document 1 (io.statefun.endpoints.v2/http)"
    )


# --------------------------------------------------------------------------- errors

EP = "module.yaml, document 1 (io.statefun.endpoints.v2/http)"
DUR = "expected a duration such as '10s' or '2 min', got"
FN = "expected a typename 'namespace/name' or 'namespace/*', got"
HTTP = "kind: io.statefun.endpoints.v2/http\nspec:\n  urlPathTemplate: http://x\n"
OKHTTP = "  transport:\n    type: io.statefun.transports.v1/okhttp\n    timeouts:\n"
KIN = "module.yaml, document 1 (io.statefun.kafka.v1/ingress)"
KOUT = "module.yaml, document 1 (io.statefun.kafka.v1/egress)"
TOPICS = "  topics: [{topic: t, valueType: a/T, targets: [a/f]}]\n"
KIN_BASE = "kind: io.statefun.kafka.v1/ingress\nspec:\n  id: a/in\n  address: k:9092\n"
KOUT_BASE = "kind: io.statefun.kafka.v1/egress\nspec:\n  id: a/out\n  address: k:9092\n"
EMB = "kind: io.pystatefun.endpoints.v1/embedded\nspec:\n"
EMBS = "module.yaml, document 1 (io.pystatefun.endpoints.v1/embedded)"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "kind: io.pystatefun.stdout.v1/egress\nspec: {id: a/b}\n---\n"
            + ENDPOINT
            + "  transport:\n    call: soon\n",
            "module.yaml, document 2 (io.statefun.endpoints.v2/http): spec.transport.call: "
            "expected a duration such as '10s' or '2 min', got 'soon'",
        ),
        (
            ENDPOINT + "  transport: {timeouts: {connect: 1.5s}}\n",
            f"{EP}: spec.transport.timeouts.connect: {DUR} '1.5s'",
        ),
        (
            ENDPOINT + "  transport: {call: 0s}\n",
            f"{EP}: spec.transport.call: expected a duration longer than 0, got '0s'",
        ),
        (
            ENDPOINT + OKHTTP + "      call: 5s\n      connect: 1s\n      read: 6s\n",
            f"{EP}: spec.transport.timeouts.read: 6s is longer than the call timeout (5s)",
        ),
        (
            ENDPOINT + OKHTTP + "      call: 5s\n",
            f"{EP}: spec.transport.timeouts.connect: 10s (the default) is longer than the call "
            "timeout (5s)",
        ),
        (
            ENDPOINT + "  transport: {type: io.statefun.transports.v1/grpc}\n",
            f"{EP}: spec.transport.type: expected 'io.statefun.transports.v1/async' or "
            "'io.statefun.transports.v1/okhttp', got 'io.statefun.transports.v1/grpc'",
        ),
        (
            ENDPOINT + "  maxNumBatchRequests: many\n",
            f"{EP}: spec.maxNumBatchRequests: expected an integer from 1 to 2147483647, got 'many'",
        ),
        (
            ENDPOINT + "  transport: [1]\n",
            f"{EP}: spec.transport: expected a mapping, got a list",
        ),
        (
            "kind: io.statefun.endpoints.v2/http\nspec:\n  functions: a/*\n",
            f"{EP}: spec.urlPathTemplate: missing; expected an http(s) URL such as "
            "'http://localhost:8000/{function.name}'",
        ),
        (
            "kind: io.statefun.endpoints.v2/http\nspec:\n  functions: a/*\n  urlPathTemplat: http://x\n",
            f"{EP}: spec.urlPathTemplate: missing; expected an http(s) URL such as "
            "'http://localhost:8000/{function.name}' (did you mean 'urlPathTemplat'?)",
        ),
        (
            "kind: io.statefun.endpoints.v2/http\nspec:\n  functions: a/*\n  urlPathTemplate: ftp://x/y\n",
            f"{EP}: spec.urlPathTemplate: expected an http(s) URL such as "
            "'http://localhost:8000/{function.name}', got 'ftp://x/y'",
        ),
        (
            HTTP + "  functions: greeter\n",
            f"{EP}: spec.functions: {FN} 'greeter'",
        ),
        (
            HTTP + "  functions: a/b/c\n",
            f"{EP}: spec.functions: {FN} 'a/b/c'",
        ),
        (
            HTTP + "  functions: '*/x'\n",
            f"{EP}: spec.functions: {FN} '*/x'",
        ),
        (
            HTTP + "  functions: a/gre*\n",
            f"{EP}: spec.functions: {FN} 'a/gre*'",
        ),
        (
            HTTP + "  functions: [a/b]\n",
            f"{EP}: spec.functions: {FN} a list",
        ),
        (
            "kind: io.statefun.endpoints.v3/http\nspec: {}\n",
            "module.yaml, document 1 (io.statefun.endpoints.v3/http): kind: unknown kind "
            "'io.statefun.endpoints.v3/http'; expected one of: io.statefun.endpoints.v2/http, ",
        ),
        (
            "spec: {}\n",
            "module.yaml, document 1: kind: missing; every document needs 'kind' and 'spec'",
        ),
        (
            "kind: io.pystatefun.stdout.v1/egress\n",
            "module.yaml, document 1: spec: missing; every document needs 'kind' and 'spec'",
        ),
        (
            "- a\n- b\n",
            "module.yaml, document 1: expected a mapping with 'kind' and 'spec', got a list",
        ),
        (
            "kind: 5\nspec: {}\n",
            "module.yaml, document 1: kind: expected a component kind such as "
            "'io.statefun.endpoints.v2/http', got 5",
        ),
        # pystatefun kinds are strict
        (
            EMB + "  functions: a/b\n  module: m:f\n  modul: x\n",
            f"{EMBS}: spec.modul: unknown field; expected one of: functions, module",
        ),
        (
            EMB + "  functions: a/b\n",
            f"{EMBS}: spec.module: missing; expected an object reference "
            "'package.module:attribute'",
        ),
        (
            EMB + "  functions: a/b\n  module: my-module\n",
            f"{EMBS}: spec.module: expected an object reference 'package.module:attribute' or "
            "'path/file.py:attribute', got 'my-module'",
        ),
        (
            "kind: io.pystatefun.http.v1/ingress\nspec: {id: a/b, port: '8080'}\n",
            "module.yaml, document 1 (io.pystatefun.http.v1/ingress): spec.port: "
            "expected an integer from 0 to 65535, got '8080'",
        ),
        (
            "kind: io.pystatefun.http.v1/ingress\nspec: {id: a/b, replyTimeout: later}\n",
            "module.yaml, document 1 (io.pystatefun.http.v1/ingress): spec.replyTimeout: "
            "expected a duration such as '10s' or '2 min', got 'later'",
        ),
        (
            "kind: io.pystatefun.file.v1/ingress\nspec: {id: a/b}\n",
            "module.yaml, document 1 (io.pystatefun.file.v1/ingress): spec.path: missing; "
            "expected a file path",
        ),
        (
            "kind: io.pystatefun.stdout.v1/egress\nspec: {id: console}\n",
            "module.yaml, document 1 (io.pystatefun.stdout.v1/egress): spec.id: "
            "expected a typename 'namespace/name', got 'console'",
        ),
        (
            "kind: io.pystatefun.file.v1/egress\nspec: {path: x}\n",
            "module.yaml, document 1 (io.pystatefun.file.v1/egress): spec.id: "
            "missing; expected a typename 'namespace/name'",
        ),
        # kafka
        (
            KIN_BASE,
            f"{KIN}: spec.topics: missing; expected a list of topics with topic, valueType "
            "and targets",
        ),
        (
            KIN_BASE + "  topics: []\n",
            f"{KIN}: spec.topics: expected at least one topic, got an empty list",
        ),
        (
            KIN_BASE + "  topics: [{topic: t, targets: [a/f]}]\n",
            f"{KIN}: spec.topics[0].valueType: missing; expected a typename 'namespace/name'",
        ),
        (
            KIN_BASE + "  topics: [{topic: t, valueType: a/T, targets: [a/f, fn]}]\n",
            f"{KIN}: spec.topics[0].targets[1]: expected a typename 'namespace/name', got 'fn'",
        ),
        (
            "kind: io.statefun.kafka.v1/ingress\nspec:\n  id: a/in\n" + TOPICS,
            f"{KIN}: spec.address: missing; expected the Kafka bootstrap servers such as "
            "'kafka:9092' (or a bootstrap.servers property)",
        ),
        (
            KIN_BASE + TOPICS + "  startupPosition: {type: newest}\n",
            f"{KIN}: spec.startupPosition.type: expected one of group-offsets, earliest, latest, "
            "specific-offsets, date; got 'newest'",
        ),
        (
            KIN_BASE + TOPICS + "  startupPosition: {type: date, date: '2020-02-01'}\n",
            f"{KIN}: spec.startupPosition.date: expected a date such as "
            "'2020-02-01 04:15:00.000 +0000', got '2020-02-01'",
        ),
        (
            KIN_BASE
            + TOPICS
            + "  startupPosition: {type: date, date: '2020-02-30 00:00:00.000 Z'}\n",
            f"{KIN}: spec.startupPosition.date: expected a date such as "
            "'2020-02-01 04:15:00.000 +0000', got '2020-02-30 00:00:00.000 Z'",
        ),
        (
            KIN_BASE + TOPICS + "  startupPosition: {type: specific-offsets, offsets: [{t: 5}]}\n",
            f"{KIN}: spec.startupPosition.offsets[0]: expected a partition 'topic/partition', "
            "got 't'",
        ),
        (
            KIN_BASE + TOPICS + "  startupPosition: {type: group-offsets}\n",
            f"{KIN}: spec.startupPosition.type: 'group-offsets' needs a consumer group: "
            "set spec.consumerGroupId",
        ),
        (
            KIN_BASE + TOPICS + "  autoOffsetResetPosition: middle\n",
            f"{KIN}: spec.autoOffsetResetPosition: expected 'earliest' or 'latest', got 'middle'",
        ),
        (
            KIN_BASE + TOPICS + "  properties: {a: b}\n",
            f"{KIN}: spec.properties: expected a list of single-key mappings such as "
            "'- foo.config: bar', got a mapping",
        ),
        (
            KIN_BASE + TOPICS + "  properties: [a]\n",
            f"{KIN}: spec.properties[0]: expected a single-key mapping such as "
            "'foo.config: bar', got 'a'",
        ),
        (
            "kind: io.statefun.kafka.v1/egress\nspec: {id: a/out}\n",
            f"{KOUT}: spec.address: missing; expected the Kafka bootstrap servers such as "
            "'kafka:9092'",
        ),
        (
            KOUT_BASE + "  deliverySemantic: {type: exactly-once}\n",
            f"{KOUT}: spec.deliverySemantic.transactionTimeout: missing; "
            "expected a duration such as '10s' or '2 min'",
        ),
        (
            KOUT_BASE + "  deliverySemantic: {type: twice}\n",
            f"{KOUT}: spec.deliverySemantic.type: expected one of at-least-once, "
            "exactly-once, none; got 'twice'",
        ),
        (
            'version: "2.0"\nmodule: {}\n',
            "module.yaml, document 1: version: expected '3.0' (StateFun's single-document "
            "format), got '2.0'",
        ),
    ],
)
def test_errors_name_file_document_kind_field_and_expectation(text: str, message: str) -> None:
    assert error(text).startswith(message)


def test_group_offsets_error_needs_missing_group() -> None:
    # with a group, group-offsets is fine (guards the case above from passing vacuously)
    assert kafka_ingress("startupPosition: {type: group-offsets}\n").consumer_group_id == "g"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            ENDPOINT + "---\n" + ENDPOINT.replace("example/*", "shop/cart") + "---\n"
            f"{EMB}  functions: shop/cart\n  module: m:f\n",
            "module.yaml, document 3 (io.pystatefun.endpoints.v1/embedded): spec.functions: "
            "functions 'shop/cart' are already served by "
            "module.yaml, document 2 (io.statefun.endpoints.v2/http)",
        ),
        (
            "kind: io.pystatefun.http.v1/ingress\nspec: {id: a/in}\n---\n" + KIN_BASE + TOPICS,
            "module.yaml, document 2 (io.statefun.kafka.v1/ingress): spec.id: ingress id 'a/in' "
            "is already defined by module.yaml, document 1 (io.pystatefun.http.v1/ingress)",
        ),
        (
            "kind: io.pystatefun.stdout.v1/egress\nspec: {id: a/out}\n---\n" + KOUT_BASE,
            "module.yaml, document 2 (io.statefun.kafka.v1/egress): spec.id: egress id 'a/out' "
            "is already defined by module.yaml, document 1 (io.pystatefun.stdout.v1/egress)",
        ),
    ],
)
def test_duplicates_are_errors(text: str, message: str) -> None:
    assert error(text) == message


def test_same_id_for_an_ingress_and_an_egress_is_fine() -> None:
    text = "kind: io.pystatefun.stdout.v1/egress\nspec: {id: a/x}\n---\n"
    text += "kind: io.pystatefun.http.v1/ingress\nspec: {id: a/x}\n"
    module = load_module_text(text)
    assert (len(module.ingresses), len(module.egresses)) == (1, 1)


def test_messages_use_the_given_name() -> None:
    assert error("kind: x/y\nspec: {}\n", name="conf/extra.yaml").startswith(
        "conf/extra.yaml, document 1 (x/y): kind: unknown kind 'x/y'"
    )


def test_empty_file_is_an_empty_module() -> None:
    module = load_module_text("# nothing\n---\n---\n")
    assert (module.endpoints, module.ingresses, module.egresses) == ((), (), ())


def test_statefun_quirks_kept_property_first_key_and_last_topic_win(
    caplog: pytest.LogCaptureFixture,
) -> None:
    text = KIN_BASE + "  topics:\n"
    text += "    - {topic: t, valueType: a/Old, targets: [a/f]}\n"
    text += "    - {topic: t, valueType: a/New, targets: [a/g]}\n"
    text += "  properties:\n    - {first: 1, second: 2}\n"
    with caplog.at_level(logging.WARNING, logger="statefun.module._loader"):
        (ingress,) = load_module_text(text).ingresses
    assert isinstance(ingress, KafkaIngressSpec)
    assert ingress.properties == {"first": "1"}
    assert ingress.topics == (KafkaTopicSpec("t", "a/New", ("a/g",)),)
    assert "only the first key (first) is used" in caplog.text
    assert "topic 't' listed again" in caplog.text


def test_file_egress_delivery_semantic() -> None:
    from statefun.module import load_module_text

    base = "kind: io.pystatefun.file.v1/egress\nspec:\n  id: a/b\n  path: out.jsonl\n"
    assert load_module_text(base).egresses[0].exactly_once is True
    module = load_module_text(base + "  deliverySemantic: at-least-once\n")
    assert module.egresses[0].exactly_once is False
    with pytest.raises(ModuleError, match=r"spec.deliverySemantic: expected one of exactly-once"):
        load_module_text(base + "  deliverySemantic: sometimes\n")


def test_delivery_semantic_as_a_string_or_a_mapping_for_both_egresses() -> None:
    from statefun.module import load_module_text

    kafka = "kind: io.statefun.kafka.v1/egress\nspec:\n  id: a/out\n  address: k:9092\n"
    (egress,) = load_module_text(kafka + "  deliverySemantic: exactly-once\n").egresses
    assert isinstance(egress, KafkaEgressSpec)
    assert egress.delivery_semantic == "exactly-once"
    assert egress.transaction_timeout == timedelta(minutes=15)
    (egress,) = load_module_text(kafka + "  deliverySemantic: none\n").egresses
    assert isinstance(egress, KafkaEgressSpec) and egress.delivery_semantic == "none"
    with pytest.raises(ModuleError, match=r"spec.deliverySemantic: expected one of at-least-once"):
        load_module_text(kafka + "  deliverySemantic: twice\n")

    file = "kind: io.pystatefun.file.v1/egress\nspec:\n  id: a/b\n  path: out.jsonl\n"
    for text, exactly_once in [
        ("{type: exactly-once, transactionTimeout: 5min}", True),
        ("{type: exactly-once}", True),
        ("{type: at-least-once}", False),
    ]:
        (egress,) = load_module_text(file + f"  deliverySemantic: {text}\n").egresses
        assert egress.exactly_once is exactly_once, text
    with pytest.raises(ModuleError, match=r"spec.deliverySemantic.type: expected one of exactly"):
        load_module_text(file + "  deliverySemantic: {type: none}\n")
    with pytest.raises(ModuleError, match=r"spec.deliverySemantic.transactionTimeout: "):
        load_module_text(file + "  deliverySemantic: {type: exactly-once, transactionTimeout: x}\n")
    with pytest.raises(ModuleError, match=r"spec.deliverySemantic.typo: unknown field"):
        load_module_text(file + "  deliverySemantic: {type: exactly-once, typo: 1}\n")
