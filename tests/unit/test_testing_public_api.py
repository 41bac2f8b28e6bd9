"""Pins the public surface of the test kit, statefun.testing."""

import statefun.testing

TESTING_NAMES = {
    "Delayed",
    "EgressRecord",
    "FunctionFailedError",
    "FunctionHarness",
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
