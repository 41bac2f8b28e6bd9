"""A clustered job's settings, names, key-group mapping and refusals (no Kafka needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from statefun._exceptions import ConfigurationError
from statefun._settings import Settings
from statefun.cluster import check_clusterable, cluster_config, unsupported
from statefun.module import load_module


def _settings(**overrides: str) -> Settings:
    base = {"cluster.bootstrap_servers": "127.0.0.1:9092", "cluster.job_id": "shop"}
    base.update(overrides)
    return Settings.load(base, environ={})


def test_single_process_without_bootstrap_servers() -> None:
    assert cluster_config(Settings.load({}, environ={})) is None


def test_dotted_names_on_the_command_line_are_the_settings() -> None:
    settings = _settings(**{"cluster.worker_id": "w1", "cluster.partitions": "16"})
    assert settings.cluster_bootstrap_servers == "127.0.0.1:9092"
    assert settings.cluster_job_id == "shop"
    config = cluster_config(settings)
    assert config is not None
    assert config.worker_id == "w1"
    assert config.partitions == 16
    assert config.exchange_topic == "pystatefun.shop.exchange"
    assert config.changelog_topic == "pystatefun.shop.changelog"
    assert config.replies_topic == "pystatefun.shop.replies"
    assert config.group_id == "pystatefun.shop"
    assert config.transactional_base == "pystatefun.shop.w1"


def test_the_worker_id_defaults_to_the_host_name() -> None:
    config = cluster_config(_settings())
    assert config is not None and config.worker_id


@pytest.mark.parametrize("max_p, partitions", [(128, 128), (128, 32), (128, 7), (10, 3), (1, 1)])
def test_partitions_hold_contiguous_key_group_ranges(max_p: int, partitions: int) -> None:
    config = cluster_config(
        _settings(max_parallelism=str(max_p), parallelism="1", cluster_partitions=str(partitions))
    )
    assert config is not None
    seen: list[int] = []
    for partition in range(partitions):
        groups = config.key_groups_of(partition)
        assert len(groups) >= 1
        assert all(config.partition_of(kg) == partition for kg in groups)
        seen.extend(groups)
    assert seen == list(range(max_p))


def test_a_partition_is_a_key_group_by_default() -> None:
    config = cluster_config(_settings())
    assert config is not None
    assert config.partitions == 128
    assert [config.partition_of(kg) for kg in range(128)] == list(range(128))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"cluster.job_id": ""}, r"^cluster_job_id must be set when cluster_bootstrap_servers"),
        ({"cluster.job_id": "a/b"}, r"^cluster_job_id 'a/b' must be 1-200 characters"),
        ({"cluster.worker_id": "x y"}, r"^cluster_worker_id 'x y' must be"),
        ({"cluster.partitions": "129"}, r"^cluster_partitions \(129\) must be at most max_para"),
        (
            {"cluster.heartbeat_interval_ms": "5000"},
            r"^cluster_heartbeat_interval_ms \(5000\) must be at most a third",
        ),
        (
            {"cluster.transaction_timeout_ms": "1000"},
            r"^cluster_transaction_timeout_ms \(1000\) must be longer than checkpoint_interval",
        ),
        (
            {"cluster.transaction_timeout_ms": "2000", "checkpoint_interval_ms": "2500"},
            r"^cluster_transaction_timeout_ms \(2000\) must be longer than checkpoint_interval_ms "
            r"\(2500\)",
        ),
        (
            {"cluster.transaction_timeout_ms": "-1"},
            r"^cluster_transaction_timeout_ms must be at least 0, got -1$",
        ),
    ],
)
def test_bad_cluster_settings_are_one_line(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as caught:
        cluster_config(_settings(**overrides))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("interval_ms", "chosen_ms", "expected_ms"),
    [
        (1000, 0, 5000),  # three intervals, at least 5 s
        (300, 0, 5000),
        (2500, 0, 7500),
        (60_000, 0, 180_000),
        (1000, 2000, 2000),  # as set
        (1000, 60_000, 60_000),
    ],
)
def test_the_transaction_timeout_is_a_few_checkpoint_intervals(
    interval_ms: int, chosen_ms: int, expected_ms: int
) -> None:
    settings = _settings(
        checkpoint_interval_ms=str(interval_ms),
        **{"cluster.transaction_timeout_ms": str(chosen_ms)},
    )
    config = cluster_config(settings)
    assert config is not None
    assert config.transaction_timeout_ms == expected_ms


def test_cluster_settings_are_range_checked_at_load() -> None:
    with pytest.raises(ConfigurationError, match="cluster_replication_factor must be at least 1"):
        _settings(**{"cluster.replication_factor": "0"})


MODULE = """\
kind: io.statefun.endpoints.v2/http
spec:
  functions: example/*
  urlPathTemplate: http://127.0.0.1:8000/statefun
---
kind: io.statefun.kafka.v1/ingress
spec:
  id: example/in
  address: 127.0.0.1:9092
  consumerGroupId: g
  topics:
    - topic: in
      valueType: io.statefun.types/string
      targets: [example/counter]
---
kind: io.statefun.kafka.v1/egress
spec:
  id: example/out
  address: 127.0.0.1:9092
  deliverySemantic: exactly-once
---
kind: io.pystatefun.http.v1/ingress
spec:
  id: example/http
  port: 8091
"""

REFUSED = """\
---
kind: io.pystatefun.file.v1/egress
spec:
  id: example/file
  path: out.jsonl
"""


def test_functions_and_kafka_in_and_out_on_the_job_cluster_run_clustered(tmp_path: Path) -> None:
    path = tmp_path / "module.yaml"
    path.write_text(MODULE)
    module = load_module(path)
    assert unsupported(module, _settings(), "127.0.0.1:9092") == []
    check_clusterable(module, _settings(), from_savepoint=False, bootstrap="127.0.0.1:9092")


def test_kafka_on_another_cluster_and_other_startup_positions_are_refused(
    tmp_path: Path,
) -> None:
    path = tmp_path / "module.yaml"
    path.write_text(MODULE)
    module = load_module(path)
    reasons = unsupported(module, _settings(), "10.0.0.1:9092")
    assert [r.split(" (")[0] for r in reasons] == ["ingress example/in", "egress example/out"]
    assert all("is not the job's Kafka cluster (10.0.0.1:9092)" in r for r in reasons)
    path.write_text(
        MODULE.replace(
            "  consumerGroupId: g\n",
            "  consumerGroupId: g\n  startupPosition:\n    type: group-offsets\n",
        )
    )
    reasons = unsupported(load_module(path), _settings(), "127.0.0.1:9092")
    assert (
        len(reasons) == 1 and "startupPosition group-offsets cannot be used clustered" in reasons[0]
    )


def test_what_cannot_run_clustered_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "module.yaml"
    path.write_text(MODULE + REFUSED)
    module = load_module(path)
    reasons = unsupported(module, _settings(state_backend="rocksdb", reply_release="immediate"))
    assert [r.split(":")[0] for r in reasons] == [
        "egress example/file (" + str(path) + ", document 5 (io.pystatefun.file.v1/egress))",
        "reply_release=immediate",
    ]  # (the RocksDB backend runs clustered: a local copy of the changelog)
    refused = r"^cluster: egress example/file .* \(and 1 more\)$"
    with pytest.raises(ConfigurationError, match=refused):
        settings = _settings(state_backend="rocksdb", reply_release="immediate")
        check_clusterable(module, settings, from_savepoint=True)


def test_rocksdb_runs_clustered_where_rocksdict_is_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    path = tmp_path / "module.yaml"
    path.write_text(MODULE.split("---\nkind: io.pystatefun.http.v1/ingress")[0])
    module = load_module(path)
    settings = _settings(state_backend="rocksdb")
    installed = importlib.util.find_spec("rocksdict") is not None
    assert (unsupported(module, settings, "127.0.0.1:9092") == []) is installed
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "rocksdict" else find_spec(name)
    )
    assert unsupported(module, settings, "127.0.0.1:9092") == [
        "state_backend=rocksdb needs rocksdict, which is not installed: "
        "pip install 'pystatefun[rocksdb]'"
    ]


def test_reply_release_immediate_is_refused_only_with_an_http_ingress(tmp_path: Path) -> None:
    path = tmp_path / "module.yaml"
    path.write_text(MODULE.split("---\nkind: io.pystatefun.http.v1/ingress")[0])
    module = load_module(path)
    assert unsupported(module, _settings(reply_release="immediate"), "127.0.0.1:9092") == []


def test_http_ingress_ports_past_65535_for_the_workers_are_refused() -> None:
    from statefun.cluster._supervisor import supervise
    from statefun.module._specs import HttpIngressSpec, ModuleSpec

    module = ModuleSpec(ingresses=(HttpIngressSpec(id="example/http", port=65534),))
    refused = r"^ingress example/http: port 65534 \+ 3 workers goes past port 65535"
    with pytest.raises(ConfigurationError, match=refused):
        supervise(module, _settings(), [], [], 3)
