"""The reports the side-by-side benchmark prints, from runs made up here (no broker)."""

from __future__ import annotations

from bench.statefun_jvm_vs_pystatefun import NO_METRICS, Phase, Run, metrics_cost


def run(runtime: str, cpu_s: float, records_per_s: float) -> Run:
    warm_up = Phase("warm-up", 10, 100, 2000.0, outputs=100, cpu_s=1.0)
    latency = Phase("many keys @ 1,000/s", 10, 1000, 1000.0, outputs=1000, cpu_s=1.0)
    phase = Phase("many keys", 10, 1000, None, outputs=1000, cpu_s=cpu_s)
    phase.records_per_s = records_per_s
    return Run(runtime, "exactly-once", [warm_up, latency, phase])


def test_metrics_cost_compares_each_on_run_with_its_off_run() -> None:
    runs = [
        run("pystatefun", 1.0, 900.0),
        run(NO_METRICS, 0.98, 1000.0),
        run(NO_METRICS, 1.0, 1000.0),
        run("pystatefun", 1.0, 1100.0),
    ]
    report = metrics_cost(runs)
    lines = [line for line in report.splitlines() if line.startswith("| exactly-once")]
    # records per CPU-second: 1000/1.0 against 1000/0.98 (-2.0%) and 1000/1.0 (+0.0%)
    assert lines == [
        "| exactly-once | many keys | 2 | -1.0% (-2.0 to +0.0) | +0.0% (-10.0 to +10.0) |"
    ]
    assert report.endswith("records per runtime CPU-second: -1.0%")


def test_no_cost_report_without_both_runtimes() -> None:
    assert metrics_cost([run("pystatefun", 1.0, 1000.0), run("statefun-jvm", 1.0, 900.0)]) == ""
