"""Skein's capacity model: how many nodes serve a load, and which part saturates first.

Its inputs are per-unit costs `skein-bench` measures (CPU per call and per turn of the lead, the
workers, nats-server and redis-server; the lead's memory per turn in flight; Redis bytes), read
from the bench's JSON. It first replays the bench's own machine (every part on one host's cores)
and compares the throughput it predicts with the throughput measured, then sizes clusters.

    model.py BENCH_JSON                       the reproduction and the sizing tables
    model.py BENCH_JSON --cores 4 --mem-gib 8 a different node size

The model is deliberately small: each part is a pool of cores that work is spread over, run at
most at UTILISATION; a JetStream stream's leader and a Redis shard are each one serial resource
(about one core of work); memory is per turn in flight and per stored session.
"""

import argparse
import json
import math

# Highest share of a resource the model plans to use (queues grow without bound near 100 %).
UTILISATION = 0.7
# Stored session size (a 40-message session, the bench's session blob) and Redis' overhead on it.
SESSION_BYTES = 9 * 1024
REDIS_OVERHEAD = 1.5


def figures(path):
    with open(path) as f:
        data = json.load(f)
    return {row["name"]: row["value"] for row in data["figures"]}


def costs(fig, unit):
    """CPU seconds per unit for each part, as measured."""
    parts = ("lead", "workers", "nats-server", "redis-server")
    return {p: fig[f"cost per {unit}: {p} CPU"] / 1e6 for p in parts}


def reproduce(fig, host_cores):
    """The bench's host runs every part: throughput is its cores over the sum of the costs."""
    rows = []
    for unit, measured in (
        ("call", fig["skein: no-op tool calls with 2 worker(s)"]),
        ("turn", fig["skein: burst throughput"]),
    ):
        cpu = sum(costs(fig, unit).values())
        predicted = host_cores / cpu
        rows.append((unit, cpu * 1e6, predicted, measured))
    return rows


def size(fig, unit, rate, cores, partitions):
    """Cores and nodes each part needs for `rate` units/s, and the serial ceilings."""
    c = costs(fig, unit)
    need = {p: rate * c[p] / UTILISATION for p in c}
    # One stream's leader and one Redis shard are serial: about one core each.
    stream_ceiling = partitions * UTILISATION / c["nats-server"]
    shard_ceiling = UTILISATION / c["redis-server"]
    shards = math.ceil(rate / shard_ceiling)
    nodes = {p: max(1, math.ceil(need[p] / cores)) for p in need}
    return need, nodes, stream_ceiling, shards


def memory(fig, sessions, in_flight_share, mem_gib):
    """Lead memory for the turns in flight and Redis memory for the stored sessions."""
    per_turn = fig["skein: lead peak RSS growth per in-flight turn"] * 1024
    turns = sessions * in_flight_share
    lead_bytes = turns * per_turn
    redis_bytes = sessions * SESSION_BYTES * REDIS_OVERHEAD
    node = mem_gib * 2**30 * UTILISATION
    return turns, lead_bytes, math.ceil(lead_bytes / node), redis_bytes, math.ceil(redis_bytes / node)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_json")
    parser.add_argument("--host-cores", type=float, default=2.0, help="cores of the bench's host")
    parser.add_argument("--cores", type=int, default=4, help="cores of a cluster node")
    parser.add_argument("--mem-gib", type=int, default=8, help="memory of a cluster node")
    parser.add_argument(
        "--in-flight", type=float, default=0.05,
        help="share of concurrent sessions with a turn running (the rest wait for their user)",
    )
    args = parser.parse_args()
    fig = figures(args.bench_json)

    print("## The bench's host, reproduced\n")
    print("| unit | CPU per unit, all parts (µs) | predicted /s | measured /s | error |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for unit, cpu_us, predicted, measured in reproduce(fig, args.host_cores):
        error = (predicted / measured - 1) * 100
        print(f"| {unit} | {cpu_us:.0f} | {predicted:,.0f} | {measured:,.0f} | {error:+.0f} % |")

    for unit, rates in (("call", (10_000, 30_000, 100_000, 300_000)),
                        ("turn", (1_000, 5_000, 20_000, 50_000))):
        print(f"\n## {unit.capitalize()}s: nodes of {args.cores} cores per part\n")
        print(f"| {unit}s/s | lead nodes | worker nodes | NATS nodes | Redis shards | "
              "stream partitions | first to saturate |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | --- |")
        for rate in rates:
            need, nodes, ceiling_one, shards = size(fig, unit, rate, args.cores, 1)
            partitions = math.ceil(rate / ceiling_one)
            if partitions > 1:
                first = "one stream's leader (one partition)"
            else:
                first = max(need, key=need.get)
            print(f"| {rate:,} | {nodes['lead']} | {nodes['workers']} | {nodes['nats-server']} | "
                  f"{shards} | {partitions} | {first} |")

    print(f"\n## Memory: concurrent sessions, nodes of {args.mem_gib} GiB\n")
    print("| sessions | share with a turn running | turns in flight | lead memory | lead nodes | "
          "Redis memory | Redis nodes |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for sessions in (10_000, 100_000, 1_000_000):
        for share in sorted({args.in_flight, 1.0}):
            turns, lead, lead_nodes, redis, redis_nodes = memory(
                fig, sessions, share, args.mem_gib)
            print(f"| {sessions:,} | {share:.0%} | {turns:,.0f} | {lead / 2**30:.1f} GiB | "
                  f"{lead_nodes} | {redis / 2**30:.1f} GiB | {redis_nodes} |")

if __name__ == "__main__":
    main()
