"""The soak's verdict (``bench/soak_report.py``) and its start records (``bench/soak_gauges.py``),
on made-up samples: a steady run passes, each kind of wear fails, and the warm-up is never
judged. The soak's own smoke test (``tests/test_bench_smoke.py``) runs it end to end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.soak_gauges import StartRecords
from bench.soak_report import checks, row_bound

OPTIONS: dict[str, Any] = {
    "compare_samples": 5,
    "rate": 100,
    "retention_seconds": 90.0,
    "prune_interval_seconds": 30.0,
}


def _row(minute: float, warmup: bool = False, **figures: float) -> dict[str, Any]:
    steady = {
        "jobs_per_s": 100.0,
        "pickup_p99_ms": 20.0,
        "size_mb": 10.0,
        "dead_tuples": 8000.0,
        "worker_rss_mb": 130.0,
        "rows": 9000,
    }
    return {"minute": minute, "warmup": warmup, **steady, **figures}


def _run(**last: float) -> list[dict[str, Any]]:
    """Five minutes of warm-up with growing sizes, 20 steady minutes, and ``last`` in the
    final five."""
    warmup = [_row(m - 5, warmup=True, size_mb=2.0 * m, worker_rss_mb=100.0) for m in range(5)]
    steady = [_row(m) for m in range(1, 16)]
    final = [_row(m, False, **last) for m in range(16, 21)]
    return warmup + steady + final


def _failed(rows: list[dict[str, Any]]) -> set[str]:
    return {check.name for check in checks(rows, OPTIONS) if not check.passed}


def test_a_steady_run_passes_whatever_its_warm_up_did() -> None:
    # The warm-up's sizes grew fivefold and its RSS was lower: neither is judged.
    assert _failed(_run()) == set()


def test_each_figure_that_wears_fails_its_check() -> None:
    assert _failed(_run(pickup_p99_ms=24.0)) == {"pickup p99 (ms)"}
    assert _failed(_run(size_mb=11.6)) == {"job table + indexes (MB)"}
    assert _failed(_run(worker_rss_mb=150.0)) == {"worker RSS, all workers (MB)"}
    assert _failed(_run(dead_tuples=9300.0)) == {"dead tuples"}
    # Throughput is judged both ways: a drop and a surge (a backlog draining) both fail.
    assert _failed(_run(jobs_per_s=84.0)) == {"throughput (jobs/s)"}
    assert _failed(_run(jobs_per_s=116.0)) == {"throughput (jobs/s)"}
    # Within 15 %, and a cost that fell, pass.
    assert _failed(_run(pickup_p99_ms=22.9, size_mb=5.0, jobs_per_s=86.0)) == set()


def test_the_row_bound_is_judged_on_the_measured_samples() -> None:
    bound = row_bound(OPTIONS)
    assert bound == 100 * (90 + 2 * 30 + 10)
    assert _failed(_run(rows=bound + 1)) == {"job rows (most at any sample)"}
    rows = _run()
    rows[0]["rows"] = 10 * bound  # during the warm-up: not judged
    assert _failed(rows) == set()


def test_a_run_too_short_to_compare_fails_rather_than_passes() -> None:
    assert "throughput (jobs/s)" in _failed([_row(1.0)])
    assert "throughput (jobs/s)" in _failed([_row(0.0, warmup=True), _row(1.0)])


def test_a_run_saved_before_warm_ups_were_sampled_is_judged_whole() -> None:
    rows = [{k: v for k, v in row.items() if k != "warmup"} for row in _run(size_mb=20.0)]
    assert _failed(rows[5:]) == {"job table + indexes (MB)"}


def test_start_records_are_read_on_from_where_the_last_read_stopped(tmp_path: Path) -> None:
    one, two = tmp_path / "starts-0.txt", tmp_path / "starts-1.txt"
    one.write_text("1 1 100.5\n2 1 100.75\n3 2 101.0\n4 1 10", encoding="utf-8")
    records = StartRecords([one, two])  # the second worker has written nothing yet
    # A retry's start (attempt 2) is no pickup; a line still being written waits.
    assert records.first_attempts() == {1: 100.5, 2: 100.75}
    with one.open("a", encoding="utf-8") as record:
        record.write("2.25\n")
    two.write_text("5 1 103.0\n", encoding="utf-8")
    assert records.first_attempts() == {4: 102.25, 5: 103.0}
    assert records.first_attempts() == {}
