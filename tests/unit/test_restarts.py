"""`statefun run`'s restart strategies, on an injected clock (no waiting)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from statefun._cli import main
from statefun._settings import Settings
from statefun.runtime._restarts import MAX_DELAY_S, RestartPolicy


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def policy(**settings: Any) -> tuple[RestartPolicy, Clock]:
    clock = Clock()
    return RestartPolicy(Settings(**settings), clock), clock


def run_then_fail(restarts: RestartPolicy, clock: Clock, ran_s: float) -> float | None:
    restarts.started()
    clock.now += ran_s
    return restarts.failed()[0]


def test_failure_rate_is_the_default_and_ends_the_process_over_the_rate() -> None:
    restarts, clock = policy(
        restart_failure_rate_max_failures=3, restart_failure_rate_interval_ms=10_000
    )
    assert restarts.strategy == "failure-rate"
    delays = [run_then_fail(restarts, clock, 1.0) for _ in range(3)]
    assert delays == [0.5, 1.0, 2.0]
    delay, why = restarts.failed()  # the 4th failure within 10 s
    assert delay is None and "4 failures within 10 s" in why


def test_failure_rate_forgets_failures_older_than_the_interval() -> None:
    restarts, clock = policy(
        restart_failure_rate_max_failures=2,
        restart_failure_rate_interval_ms=10_000,
        restart_backoff_reset_ms=0,
    )
    for _ in range(20):  # one failure every 6 s: never more than 2 within 10 s
        assert run_then_fail(restarts, clock, 6.0) is not None


def test_the_delay_starts_again_after_a_healthy_run() -> None:
    restarts, clock = policy(restart_delay_ms=100, restart_backoff_reset_ms=20_000)
    assert [run_then_fail(restarts, clock, 0.1) for _ in range(3)] == [0.1, 0.2, 0.4]
    assert run_then_fail(restarts, clock, 25.0) == 0.1  # ran 25 s: healthy
    assert run_then_fail(restarts, clock, 0.1) == 0.2


def test_exponential_counts_restarts_in_a_row_and_resets_after_a_healthy_run() -> None:
    restarts, clock = policy(
        restart_strategy="exponential", restart_attempts=3, restart_backoff_reset_ms=20_000
    )
    for _ in range(3):
        assert run_then_fail(restarts, clock, 1.0) is not None
    # a healthy period, then failures again: the count starts from 0 (it once said 7 of 10)
    restarts.started()
    clock.now += 30.0
    delay, what = restarts.failed()
    assert (delay, what) == (0.5, "1 of 3")
    assert run_then_fail(restarts, clock, 1.0) is not None
    assert run_then_fail(restarts, clock, 1.0) is not None
    assert run_then_fail(restarts, clock, 1.0) is None  # 4 in a row


def test_the_delay_is_capped() -> None:
    restarts, clock = policy(
        restart_strategy="exponential", restart_attempts=50, restart_backoff_reset_ms=0
    )
    delays = [run_then_fail(restarts, clock, 0.0) for _ in range(20)]
    assert max(d for d in delays if d is not None) == MAX_DELAY_S


def test_fixed_delay_counts_over_the_process_life_and_none_never_restarts() -> None:
    restarts, clock = policy(restart_strategy="fixed-delay", restart_attempts=2)
    assert run_then_fail(restarts, clock, 100.0) == 0.5
    assert run_then_fail(restarts, clock, 100.0) == 0.5
    assert run_then_fail(restarts, clock, 100.0) is None
    restarts, clock = policy(restart_strategy="none")
    assert run_then_fail(restarts, clock, 1.0) is None


def test_statefun_run_ends_once_failures_pass_the_rate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`statefun run` on a job that fails at once every time (quarantine off): restarted
    twice, the third failure within the interval ends the process with 1."""
    (tmp_path / "in.jsonl").write_text('{"target": "test/fails", "id": "a", "value": "boom"}\n')
    module = tmp_path / "module.yaml"
    module.write_text(
        "kind: io.pystatefun.endpoints.v1/embedded\nspec:\n  functions: test/*\n"
        "  module: tests.integration.fns.shop:functions\n---\n"
        "kind: io.pystatefun.file.v1/ingress\nspec:\n  id: test/in\n  path: in.jsonl\n"
    )
    settings = {
        "checkpoint_dir": tmp_path / "checkpoints",
        "dead_letter_path": tmp_path / "dead.jsonl",
        "quarantine_after_failures": 0,
        "restart_delay_ms": 1,
        "restart_failure_rate_max_failures": 2,
    }
    argv = ["run", str(module)] + [f"--set={k}={v}" for k, v in settings.items()]
    with caplog.at_level(logging.INFO, logger="statefun"):
        assert main(argv) == 1
    said = [r.getMessage() for r in caplog.records if r.name == "statefun.cli"]
    restarts = [line for line in said if line.startswith("restart ")]
    assert len(restarts) == 2 and restarts[1].startswith("restart 2 of at most 2 failures")
    assert any("not restarting: 3 failures within 60 s" in line for line in said)
