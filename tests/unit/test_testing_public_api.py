"""Pins the public surface of the test kit, statefun.testing."""

from pathlib import Path

import statefun.testing
from tests.unit.test_testing_job_harness import EMBEDDED

TESTING_NAMES = {
    "Delayed",
    "EgressRecord",
    "EgressStandIn",
    "FunctionFailedError",
    "FunctionHarness",
    "IngressStandIn",
    "JobHarness",
    "KafkaRecord",
    "KinesisRecord",
    "Outcome",
    "Raw",
    "SdkProcess",
    "Sent",
    "assert_outcome",
    "assert_state",
}

HARNESS_API = {
    "advance",
    "call",
    "max_invocations",
    "now",
    "pending_delayed",
    "run_until_idle",
    "send",
    "set_state",
    "state",
    "undelivered",
    "waiting",
}


def test_testing_surface() -> None:
    assert set(statefun.testing.__all__) == TESTING_NAMES
    for name in statefun.testing.__all__:
        assert getattr(statefun.testing, name) is not None


def test_harness_surface() -> None:
    from tests.unit._testing_fns import functions

    harness = statefun.testing.FunctionHarness(functions)
    public = {name for name in dir(harness) if not name.startswith("_")}
    assert public == HARNESS_API


def test_outcome_surface() -> None:
    public = {n for n in dir(statefun.testing.Outcome()) if not n.startswith("_")}
    assert public == {
        "cancellations",
        "delayed",
        "egress",
        "egress_records",
        "extend",
        "invocations",
        "messages",
        "replies",
        "reply",
        "state",
        "states",
    }


JOB_HARNESS_API = {
    "advance",
    "call",
    "checkpoint",
    "checkpoints",
    "close",
    "crash_and_restore",
    "dead_letters",
    "egress",
    "ingress",
    "module",
    "now",
    "restarts",
    "run_until_idle",
    "send",
    "settings",
    "state",
}


def test_job_harness_surface(tmp_path: Path) -> None:
    path = tmp_path / "module.yaml"
    path.write_text(EMBEDDED, encoding="utf-8")
    with statefun.testing.JobHarness(path) as harness:
        public = {name for name in dir(harness) if not name.startswith("_")}
        assert public == JOB_HARNESS_API
        ingress, egress = harness.ingress("test/in"), harness.egress("test/events")
        assert {n for n in dir(ingress) if not n.startswith("_")} == {"id", "log", "send", "source"}
        assert {n for n in dir(egress) if not n.startswith("_")} == {
            "clear",
            "id",
            "records",
            "sink",
            "transactional",
            "visible",
        }
