"""Replicas behind HAProxy (deploy/haproxy.cfg) on this host: aggregate tok/s of 1, 2 and 3
`zinc serve` replicas through the balancer (and of 1 replica without it), and the time to first
token direct to a replica against through HAProxy: what the balancer costs.

Usage: .venv/bin/python bench/bench_replicas.py [--clients 8] [--requests 4] [--max-tokens 64]
       [--runs 3] [--ttft-runs 15] [--threads 1] [--doc docs/DEPLOY.md] [--json .bench/replicas.json]
       [--render-only]  (rewrite the doc's section from the JSON of an earlier run)
(scripts/bench-replicas runs it.)

Each configuration starts its replicas (the bundled SmolLM2, `--parallel 8`, `--threads` each)
and HAProxy as tests/replicas.py does, warms them up, then runs `--runs` rounds: `--clients`
clients at once, each sending `--requests` whole greedy chat completions of `--max-tokens` one
after the other, every prompt led by a number of its own (only the chat template's system prompt
comes from the prefix cache).
Aggregate tok/s: all completion tokens (from `usage`) over the time from the first request sent
to the last answer. One replica is measured direct and through HAProxy by turns, in the same
processes; then its time to first token, one streamed request at a time, alternating direct and
through HAProxy, each on a new connection. Medians.

On a host with fewer cores than replicas x threads the replicas share the cores, so more
replicas show what the balancer costs, not how throughput scales across machines; the section
says so, with the load average beside the figures. It also computes, "on paper", what N machines
give for Llama 3.1 8B from the per-machine figures of docs/PERFORMANCE.md's Sizes section.

Writes the raw figures to --json and the markdown section between the markers in --doc.
Imports: tests.replicas (the processes and the chat client), the stdlib.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests/replicas.py: the replicas and HAProxy as processes
os.environ.setdefault("ZINC_CACHE", str(ROOT / ".zinc-cache"))

from tests.replicas import REPLICA_ARGS, Cluster, Reply, chat  # noqa: E402

BEGIN, END = "<!-- bench-replicas:begin -->", "<!-- bench-replicas:end -->"
MACHINES = (1, 2, 4, 8)  # the on-paper rows
PROMPT = "Request {n}: write a short paragraph about the history of {topic}."
TOPICS = ("bridges", "clocks", "maps", "bread", "glass", "paper", "ships", "roads")


class Prompts:
    """Fresh prompts: each one is led by a number no other prompt of the run has."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> list[dict[str, str]]:
        self.n += 1
        return [{"role": "user", "content": PROMPT.format(n=self.n, topic=TOPICS[self.n % len(TOPICS)])}]


def replica_args(threads: int) -> tuple[str, ...]:
    args = list(REPLICA_ARGS)
    args[args.index("--parallel") + 1] = "8"
    args[args.index("--threads") + 1] = str(threads)
    return tuple(args)


def aggregate(url: str, prompts: Prompts, clients: int, requests: int, max_tokens: int) -> dict[str, Any]:
    """`clients` clients at once, `requests` each in a row: all tokens over the wall time."""
    batches = [[prompts() for _ in range(requests)] for _ in range(clients)]

    def client(messages: list[list[dict[str, str]]]) -> list[Reply]:
        return [chat(url, m, max_tokens=max_tokens, timeout=300) for m in messages]

    start = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        replies = [r for batch in pool.map(client, batches) for r in batch]
    wall = time.monotonic() - start
    failed = [r for r in replies if r.status != 200 or not r.done]
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed, e.g. {failed[0]}")
    tokens = sum(r.usage["completion_tokens"] for r in replies if r.usage)
    served: dict[str, int] = {}
    for r in replies:
        served[r.served_by or "direct"] = served.get(r.served_by or "direct", 0) + 1
    return {"tokens": tokens, "seconds": wall, "tok_s": tokens / wall, "served_by": served}


def entry(label: str, n: int, direct: bool, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    tok_s = statistics.median(r["tok_s"] for r in rounds)
    print(f"{label}: {tok_s:.1f} tok/s", file=sys.stderr)
    return {"label": label, "replicas": n, "direct": direct, "tok_s": tok_s, "rounds": rounds}


def measure_one(args: argparse.Namespace, logdir: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One replica, direct and through HAProxy by turns (so the host's other load falls on both
    alike): the aggregate rounds, then the first-token pairs, one request at a time."""
    print("1 replica: starting", file=sys.stderr)
    cluster = Cluster(logdir, 1, replica_args(args.threads))
    try:
        urls = {"direct": cluster.replicas[0].url, "haproxy": cluster.lb.url}
        prompts = Prompts()
        aggregate(urls["haproxy"], prompts, args.clients, 1, 8)  # warm-up
        rounds: dict[str, list[dict[str, Any]]] = {"direct": [], "haproxy": []}
        for _ in range(args.runs):
            for name, url in urls.items():
                rounds[name].append(aggregate(url, prompts, args.clients, args.requests, args.max_tokens))
        times: dict[str, list[float]] = {"direct": [], "haproxy": []}
        for i in range(args.ttft_runs + 2):  # the first two are a warm-up
            for name, url in urls.items():
                reply = chat(url, prompts(), max_tokens=4, stream=True, timeout=60)
                if reply.first_token_at is None or not reply.done:
                    raise RuntimeError(f"{name}: {reply}")
                if i >= 2:
                    times[name].append(reply.first_token_at - reply.sent_at)
    finally:
        cluster.close()
    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"TTFT direct {median['direct'] * 1e3:.1f} ms, via HAProxy {median['haproxy'] * 1e3:.1f} ms",
          file=sys.stderr)  # fmt: skip
    throughput = [
        entry("1 replica, direct", 1, True, rounds["direct"]),
        entry("1 replica via HAProxy", 1, False, rounds["haproxy"]),
    ]
    return throughput, {"median_s": median, "runs_s": times}


def measure_many(args: argparse.Namespace, n: int, logdir: Path) -> dict[str, Any]:
    """`n` replicas through HAProxy: the aggregate rounds."""
    print(f"{n} replicas: starting", file=sys.stderr)
    cluster = Cluster(logdir, n, replica_args(args.threads))
    try:
        prompts = Prompts()
        aggregate(cluster.lb.url, prompts, args.clients, 1, 8)  # warm-up: every replica gets some
        rounds = [
            aggregate(cluster.lb.url, prompts, args.clients, args.requests, args.max_tokens)
            for _ in range(args.runs)
        ]
    finally:
        cluster.close()
    return entry(f"{n} replicas via HAProxy", n, False, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=4, help="requests per client per round")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ttft-runs", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1, help="--threads of each replica")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "DEPLOY.md")
    parser.add_argument("--json", type=Path, default=ROOT / ".bench" / "replicas.json")
    parser.add_argument(
        "--render-only", action="store_true", help="rewrite --doc from --json, measuring nothing"
    )
    args = parser.parse_args()
    if args.render_only:
        write_section(args.doc, render(json.loads(args.json.read_text())))
        return

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-replicas-") as tmp:
        logdir = Path(tmp)
        throughput, ttft = measure_one(args, logdir)
        throughput += [measure_many(args, n, logdir) for n in (2, 3)]
    result: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "host": {"cpus": os.cpu_count(), "machine": platform.machine(), "processor": cpu_name()},
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "settings": {k: v for k, v in vars(args).items() if k not in ("doc", "json")},
        "throughput": throughput,
        "ttft": ttft,
    }
    result["on_paper"] = on_paper(ROOT / "docs" / "PERFORMANCE.md", throughput)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    section = render(result)
    write_section(args.doc, section)
    print(section)


def write_section(path: Path, section: str) -> None:
    """`section` in place of what `path` has between the markers."""
    head, begin, rest = path.read_text().partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise SystemExit(f"{path} has no {BEGIN} ... {END} markers")
    path.write_text(head + BEGIN + "\n" + section + END + tail)


def sizes_row(performance: Path, model: str, column: str) -> dict[str, str]:
    """The row of `model` in the table of PERFORMANCE.md's Sizes section that has `column`."""
    section = performance.read_text().partition("## Sizes")[2].partition("\n## ")[0]
    header: list[str] = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| model |"):
            header = cells
        elif line.startswith(f"| {model} ") and column in header:
            return dict(zip(header, cells, strict=True))
    raise SystemExit(f"{performance}: no {model} row under a '{column}' column in the Sizes section")


def on_paper(performance: Path, throughput: list[dict[str, Any]]) -> dict[str, Any]:
    """N machines of the Sizes benchmark's kind behind HAProxy, for Llama 3.1 8B: N times one
    machine's 8-stream aggregate, less the share the balancer took here (1 replica through it
    against direct, counted only when it is a loss)."""
    model = "llama-3.1-8b Q4_0"
    row = sizes_row(performance, model, "8 streams aggregate tok/s zinc")
    one, eight = float(row["1 stream tok/s zinc"]), float(row["8 streams aggregate tok/s zinc"])
    direct = next(t["tok_s"] for t in throughput if t["direct"])
    via = next(t["tok_s"] for t in throughput if not t["direct"] and t["replicas"] == 1)
    factor = min(1.0, via / direct)
    rows = [{"machines": n, "streams": 8 * n, "aggregate_tok_s": n * eight * factor} for n in MACHINES]
    return {
        "model": model,
        "one_stream_tok_s": one,
        "eight_streams_tok_s": eight,
        "factor": factor,
        "rows": rows,
    }


def render(result: dict[str, Any]) -> str:
    s, host, load = result["settings"], result["host"], result["load_average"]
    base = next(t["tok_s"] for t in result["throughput"] if t["direct"])
    fits = max(1, host["cpus"] // s["threads"])  # replicas whose threads can each have a core
    lines = [
        f"Measured {result['when']} by `scripts/bench-replicas` on {host['cpus']} CPUs ({host['processor']}); "
        f"load average {load['before'][0]:.2f} before and {load['after'][0]:.2f} after (1 min; "
        f"{'busy: other jobs shared the host' if load['before'][0] > host['cpus'] else 'otherwise idle'}); "
        "differences inside a row's min-max spread are noise. Each replica: `zinc serve --parallel 8 --threads "
        f"{s['threads']} -c 512`, the bundled SmolLM2-135M Q4_1. {s['clients']} clients at once, each "
        f"sending {s['requests']} whole greedy chat completions of max_tokens {s['max_tokens']} in a row, "
        "every prompt new (only the system prompt is cached); aggregate tok/s is all completion tokens over "
        f"the wall time, the median of {s['runs']} rounds. The 1-replica rows are the same process, "
        "measured direct and through HAProxy by turns.",
        "",
        "| setup | aggregate tok/s | rounds min-max | vs 1 replica direct | requests per replica (last round) |",
        "|---|---:|---:|---:|---|",
    ]
    for t in result["throughput"]:
        served = ", ".join(f"{k} {v}" for k, v in sorted(t["rounds"][-1]["served_by"].items()))
        low, high = min(r["tok_s"] for r in t["rounds"]), max(r["tok_s"] for r in t["rounds"])
        lines.append(
            f"| {t['label']} | {t['tok_s']:.1f} | {low:.0f}-{high:.0f} | {t['tok_s'] / base:.2f}x | {served} |"
        )
    ttft = result["ttft"]["median_s"]
    added = (ttft["haproxy"] - ttft["direct"]) * 1e3
    lines += [
        "",
        f"Time to first token, one streamed request at a time on a new connection, median of "
        f"{s['ttft_runs']} alternating pairs on the 1-replica cluster with nothing else running on it: "
        f"{ttft['direct'] * 1e3:.1f} ms direct, {ttft['haproxy'] * 1e3:.1f} ms through HAProxy: "
        + (
            f"the balancer adds {added:.1f} ms."
            if added > 0
            else f"no cost shows ({added:+.1f} ms is noise)."
        ),
        "",
        f"This host has {host['cpus']} cores, shared by the replicas, HAProxy, the client threads and the "
        f"other jobs. With `--threads {s['threads']}` a replica keeps at most {s['threads']} core(s) busy: "
        f"past {fits} replicas more only divide the same cores, and on a busy host fewer already do. These "
        "rows show what the balancer and its routing cost, not how throughput grows with machines (that "
        "is the next table).",
        "",
    ]
    paper = result["on_paper"]
    lines += [
        f"On paper, {paper['model']} on N machines like the one of docs/PERFORMANCE.md's Sizes section "
        f"(2 threads, `zinc serve --parallel 8`: one stream {paper['one_stream_tok_s']:.2f} tok/s, 8 "
        f"streams {paper['eight_streams_tok_s']:.2f} tok/s together), behind HAProxy:",
        "",
        "| machines | streams at once | aggregate tok/s |",
        "|---:|---:|---:|",
        *(f"| {r['machines']} | {r['streams']} | {r['aggregate_tok_s']:.1f} |" for r in paper["rows"]),
        "",
        f"That is N x one machine's aggregate x {paper['factor']:.2f} (1 replica through HAProxy over "
        "direct, measured above; 1.00 when the balancer cost nothing measurable), assuming the "
        "balancer on a host of its own, sessions spread evenly by the hash (many conversations; a "
        "few can land unevenly) and each machine kept at 8 streams. Replicas add capacity, not "
        f"speed: each conversation still decodes at about {paper['one_stream_tok_s']:.1f} tok/s alone, "
        "less when its machine is full.",
        "",
    ]
    return "\n".join(lines)


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.processor()


if __name__ == "__main__":
    main()
