"""Celery peer of skein-bench: the same no-op task, round trip and throughput, with a Celery worker
on the same Redis, so the ratio comes from one run on one machine.

    celery_bench.py worker REDIS_URL            run a Celery worker (2 processes, acks late)
    celery_bench.py client REDIS_URL SAMPLES CALLS
                                                measure and print one JSON object
"""

import json
import statistics
import sys
import time

from celery import Celery


def make_app(url):
    app = Celery("skein_peer", broker=url, backend=url)
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        # At-least-once, like Skein's durable path: acknowledge after the task ran.
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
    )

    @app.task(name="noop")
    def noop():
        return "ok"

    return app, noop


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, len(ordered) * p // 100)]


def client(url, samples, calls):
    app, noop = make_app(url)
    deadline = time.monotonic() + 60
    while not app.control.ping(timeout=1.0):
        if time.monotonic() > deadline:
            raise SystemExit("the Celery worker did not answer")
    noop.delay().get(timeout=30)
    taken = []
    for _ in range(samples):
        started = time.perf_counter()
        noop.delay().get(timeout=30)
        taken.append((time.perf_counter() - started) * 1e6)
    started = time.perf_counter()
    pending = [noop.delay() for _ in range(calls)]
    for result in pending:
        result.get(timeout=300)
    elapsed = time.perf_counter() - started
    print(
        json.dumps(
            {
                "round_trip_p50_us": percentile(taken, 50),
                "round_trip_p99_us": percentile(taken, 99),
                "round_trip_mean_us": statistics.fmean(taken),
                "throughput_per_s": calls / elapsed,
            }
        )
    )


def main():
    role, url = sys.argv[1], sys.argv[2]
    if role == "worker":
        app, _ = make_app(url)
        app.worker_main(
            ["worker", "--loglevel=WARNING", "--concurrency=2", "--without-gossip", "--without-mingle"]
        )
    elif role == "client":
        client(url, int(sys.argv[3]), int(sys.argv[4]))
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main()
