"""The reports the side-by-side benchmark prints, from runs made up here (no broker)."""

from __future__ import annotations

from bench.statefun_jvm_vs_pystatefun import (
    NO_METRICS,
    PYTHON_LOOPS,
    Phase,
    Run,
    hot_backlog_by_repeat,
    merge,
    table,
    variant_cost,
)


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
    report = variant_cost(runs, NO_METRICS)
    assert report.startswith("metrics on against off (on / off - 1;")
    lines = [line for line in report.splitlines() if line.startswith("| exactly-once")]
    # records per CPU-second: 1000/1.0 against 1000/0.98 (-2.0%) and 1000/1.0 (+0.0%)
    assert lines == [
        "| exactly-once | many keys | 2 | -1.0% (-2.0 to +0.0) | +0.0% (-10.0 to +10.0) |"
    ]
    assert report.endswith("records per runtime CPU-second: -1.0%")


def test_the_compiled_loops_are_compared_with_their_python_run() -> None:
    runs = [run("pystatefun", 0.8, 1200.0), run(PYTHON_LOOPS, 1.0, 1000.0)]
    report = variant_cost(runs, PYTHON_LOOPS)
    assert report.startswith("compiled hot loops against Python ones (compiled / Python - 1;")
    lines = [line for line in report.splitlines() if line.startswith("| exactly-once")]
    assert lines == [
        "| exactly-once | many keys | 1 | +25.0% (+25.0 to +25.0) | +20.0% (+20.0 to +20.0) |"
    ]
    assert variant_cost(runs, NO_METRICS) == ""


def test_no_cost_report_without_both_runtimes() -> None:
    for variant in (NO_METRICS, PYTHON_LOOPS):
        pair = [run("pystatefun", 1.0, 1000.0), run("statefun-jvm", 1.0, 900.0)]
        assert variant_cost(pair, variant) == ""


def backlog(records_per_s: float, broker_cpu_s: float | None, reader_cpu_s: float) -> Run:
    phase = Phase("one hot key, backlog", 1, 1000, None, backlog=True, outputs=1000)
    phase.records_per_s = records_per_s
    phase.wall_s = 2.0
    phase.cpu_s, phase.server_cpu_s = 1.0, 0.5
    phase.broker_cpu_s, phase.reader_cpu_s = broker_cpu_s, reader_cpu_s
    return Run("pystatefun", "at-least-once", [phase])


def test_the_table_shows_each_phases_cpu_per_process() -> None:
    """Cores busy in the phase: runtime, function server (to three decimals), broker,
    reader; medians over the repeats; the broker's only when the run started it (its
    process is known)."""
    runs = merge([backlog(1000.0, 0.4, 0.6), backlog(1200.0, 0.2, 0.2), backlog(900.0, 0.3, 1.0)])
    [row] = [line for line in table(runs).splitlines() if "| pystatefun |" in line]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    # records/s, p50, p99, max, then runtime 1.0/2.0 s, server 0.5/2.0, broker 0.3/2.0,
    # reader 0.6/2.0 (the medians), then RSS
    assert cells[3] == "1,000 (900-1,200)"
    assert cells[7:11] == ["0.50", "0.250", "0.15", "0.30"]
    external = merge([backlog(1000.0, None, 0.6), backlog(1200.0, None, 0.2)])
    [row] = [line for line in table(external).splitlines() if "| pystatefun |" in line]
    assert [cell.strip() for cell in row.strip("|").split("|")][9] == "-"


def hot(runtime: str, semantic: str, records_per_s: float, server_cpu_s: float) -> Run:
    phase = Phase("one hot key, backlog", 1, 300_000, None, backlog=True, outputs=300_000)
    phase.records_per_s, phase.server_cpu_s, phase.wall_s = records_per_s, server_cpu_s, 4.0
    many = Phase("many keys, backlog", 10, 300_000, None, backlog=True, outputs=300_000)
    many.records_per_s, many.server_cpu_s = 5.0 * records_per_s, 1.0
    return Run(runtime, semantic, [many, phase])


def test_the_hot_backlog_is_compared_repeat_by_repeat_at_one_machine_speed() -> None:
    """Each repeat's ratio, and that ratio times the function server's CPU per record in
    pystatefun's phase over StateFun's (the machine's speed in each phase) - pairs made of
    the same repeat, whichever runtime ran first; other phases and semantics stay out."""
    runs = [
        # repeat 1: pystatefun on a slow stretch (the server took 8 us a record, not 5.7)
        hot("pystatefun", "at-least-once", 60_000.0, 2.4),
        hot("statefun-jvm", "at-least-once", 80_000.0, 1.7),
        # repeat 2: the other way round
        hot("statefun-jvm", "at-least-once", 60_000.0, 2.3),
        hot("pystatefun", "at-least-once", 81_000.0, 1.8),
        # repeat 3: StateFun's phase failed (left out, as merge() leaves it out)
        hot("pystatefun", "at-least-once", 70_000.0, 2.0),
        hot("statefun-jvm", "at-least-once", 10_000.0, 2.0),
        hot("pystatefun", "exactly-once", 50_000.0, 0.0),  # (no server CPU: left out)
        hot("statefun-jvm", "exactly-once", 40_000.0, 2.0),
    ]
    runs[5].phases[1].failed = True
    report = hot_backlog_by_repeat(runs)
    assert report == (
        "- at-least-once, one hot key, backlog, repeat by repeat: records/s pystatefun / "
        "StateFun at the function server's CPU per record in each phase (pystatefun's / "
        "StateFun's) -> at one machine speed: 0.75x at 8.0 / 5.7 us -> 1.06x; "
        "1.35x at 6.0 / 7.7 us -> 1.06x; the repeats' medians 1.05x and 1.06x"
    )
    assert hot_backlog_by_repeat(runs[:1]) == ""
