"""zinc vs llama.cpp on the CPU, in the same run, for the bundled SmolLM2-135M-Instruct Q4_1.

Usage: .venv/bin/python bench/bench.py [--quick] [--runs N] [--out docs/PERFORMANCE.md]

Measures, with 2 threads for both engines: prefill tok/s (128- and 512-token prompts), greedy decode
tok/s, cold start (a new process: imports, open the model, prefill a short prompt, first token),
peak resident memory (VmHWM of that process), zinc's first compile time and artifact size, the
host's memory read bandwidth and the bandwidth-bound decode ceiling. Every engine measurement runs
in its own subprocess (one per run, zinc and llama.cpp alternating), and the report gives medians.

The parent process imports only the standard library, numpy and zinc's metadata helpers; the
engines are imported inside the `--worker` subprocesses so that their memory and start-up are
measured alone.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
THREADS = 2
CONTEXT = 2048
COLD_PROMPT_TOKENS = 16
WARMUP_DECODE = 4
NOTES_HEADING = "## Notes"
PROMPT_TEXT = (
    "The history of computing is a story of people trying to make machines do more work with less "
    "effort. Early calculators were mechanical, built from gears and levers, and they could add or "
    "multiply numbers only as fast as a clerk could turn a crank. Later, engineers replaced the gears "
    "with relays, then with vacuum tubes, and finally with transistors etched into silicon. Each step "
    "made the machines smaller, cheaper and faster, and each step changed what people expected a "
    "computer to do. Today a phone in a pocket holds more memory than the rooms of machines that "
    "guided the first rockets, and it answers questions in plain language. "
)

Json = dict[str, Any]


def say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Measurements shared by the workers
# --------------------------------------------------------------------------------------------
def peak_memory() -> Json:
    """Peak resident memory of this process: VmHWM from /proc and ru_maxrss (both KiB on Linux)."""
    hwm_kib = 0
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                hwm_kib = int(line.split()[1])
    except OSError:
        pass
    maxrss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"vmhwm_mib": hwm_kib / 1024, "ru_maxrss_mib": maxrss_kib / 1024}


def worker_zinc(spec: Json) -> Json:
    """One zinc run: cold start, then warm prefill per prompt length, then greedy decode."""
    t_spawn = float(spec["t_spawn"])
    t_main = time.monotonic()
    from zinc.compiler.build import ensure_artifact
    from zinc.model.gguf_file import open_gguf
    from zinc.runtime.device import resolve_device
    from zinc.runtime.session import ModelSession
    from zinc.tokenizer import Tokenizer

    t_imported = time.monotonic()
    gguf = Path(spec["gguf"])
    artifact = ensure_artifact(gguf, "cpu", cache_dir=Path(spec["cache_dir"]))
    t_found = time.monotonic()
    device = resolve_device("cpu", spec["driver"], threads=int(spec["threads"]))
    session = ModelSession(artifact, gguf, device, context_length=CONTEXT)
    # a server needs the tokenizer before its first token, and llama.cpp's open loads its vocabulary
    tokenizer = Tokenizer.from_metadata(open_gguf(gguf).metadata)
    t_opened = time.monotonic()
    first = session.prefill(spec["cold_ids"]).token
    t_first = time.monotonic()
    cold = {
        "total_s": t_first - t_spawn,
        "python_start_s": t_main - t_spawn,
        "import_s": t_imported - t_main,
        "open_s": t_opened - t_imported,
        "cache_lookup_s": t_found - t_imported,
        "prefill_s": t_first - t_opened,
        "first_token": first,
    }

    prompts: dict[str, list[int]] = spec["prompts"]
    decode_prompt: list[int] = spec["decode_prompt"]
    # Warm-up (not timed): the first call of each entry point pays one-time costs.
    tok = session.prefill(decode_prompt).token
    for i in range(WARMUP_DECODE):
        tok = session.decode(tok, len(decode_prompt) + i).token

    prefill: dict[str, float] = {}
    for name, ids in prompts.items():
        t0 = time.perf_counter()
        _ = session.prefill(ids).token  # reading the greedy token waits for the device
        prefill[name] = time.perf_counter() - t0

    _, generated, decode_s = greedy_run(session, decode_prompt, int(spec["decode_tokens"]))
    memory = peak_memory()  # the same work as llama.cpp's run: model, tokenizer, KV cache, calls
    constrained = _constrained_decode(session, tokenizer, spec) if spec.get("constrained_tokens") else None
    with_matcher = peak_memory()["vmhwm_mib"] if constrained else None
    return {"cold": cold, "prefill_s": prefill, "decode_s": decode_s, "generated": generated,
            "constrained": constrained, **memory, "vmhwm_constrained_mib": with_matcher}  # fmt: skip


def greedy_run(session: Any, prompt: list[int], n: int) -> tuple[float, list[int], float]:
    """`generate_ids` as `zinc --prompt` runs it (each decode step enqueued before the token of the
    one before is read): the prompt's prefill to its greedy token and its time, then `n` more
    tokens and their time."""
    from zinc.engine.generate import generate_ids

    tokens = generate_ids(session, prompt, n + 1)
    t0 = time.perf_counter()
    out = [next(tokens)]
    t1 = time.perf_counter()
    out += tokens
    return t1 - t0, out, time.perf_counter() - t1


def _constrained_decode(session: Any, tokenizer: Any, spec: Json) -> Json:
    """Greedy decode under a JSON Schema (llguidance mask per token, logits read back each step)."""
    from zinc.engine.constraint import GrammarMatcher
    from zinc.engine.generate import generate_tokens
    from zinc.engine.grammars import json_schema_grammar

    schema = {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]}
    matcher = GrammarMatcher(json_schema_grammar(schema), tokenizer)
    ids: list[int] = spec["decode_prompt"]
    tokens = generate_tokens(session, ids, int(spec["constrained_tokens"]) + 1, constraint=matcher)
    next(tokens)  # the prefill's token
    t0 = time.perf_counter()
    n = sum(1 for _ in tokens)
    return {"tokens": n, "seconds": time.perf_counter() - t0}


def worker_llama(spec: Json) -> Json:
    """The same run through llama-cpp-python: `eval(prompt)` for prefill, single-token evals for decode."""
    t_spawn = float(spec["t_spawn"])
    t_main = time.monotonic()
    import ctypes

    import llama_cpp
    import numpy as np

    t_imported = time.monotonic()
    llm = llama_cpp.Llama(
        model_path=spec["gguf"],
        n_threads=int(spec["threads"]),
        n_threads_batch=int(spec["threads"]),
        n_ctx=CONTEXT,
        n_batch=512,
        verbose=False,
    )
    n_vocab = llm.n_vocab()

    def greedy() -> int:
        # Without logits_all, llama-cpp-python no longer copies logits into `scores`: read the
        # last output's logits straight from the context.
        ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return int(
            np.argmax(np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), (n_vocab,)))
        )

    t_opened = time.monotonic()
    llm.eval(spec["cold_ids"])
    first = greedy()
    t_first = time.monotonic()
    cold = {
        "total_s": t_first - t_spawn,
        "python_start_s": t_main - t_spawn,
        "import_s": t_imported - t_main,
        "open_s": t_opened - t_imported,
        "prefill_s": t_first - t_opened,
        "first_token": first,
    }

    prompts: dict[str, list[int]] = spec["prompts"]
    decode_prompt: list[int] = spec["decode_prompt"]
    llm.reset()  # type: ignore[no-untyped-call]
    llm.eval(decode_prompt)
    tok = greedy()
    for _ in range(WARMUP_DECODE):
        llm.eval([tok])
        tok = greedy()

    prefill: dict[str, float] = {}
    perf_prefill: dict[str, float] = {}
    for name, ids in prompts.items():
        # n_tokens = 0: the next eval() drops the KV cache from position 0
        llm.reset()  # type: ignore[no-untyped-call]
        llama_cpp.llama_perf_context_reset(llm.ctx)
        t0 = time.perf_counter()
        llm.eval(ids)
        greedy()
        prefill[name] = time.perf_counter() - t0
        perf_prefill[name] = llama_cpp.llama_perf_context(llm.ctx).t_p_eval_ms / 1e3

    llm.reset()  # type: ignore[no-untyped-call]
    llm.eval(decode_prompt)
    tok = greedy()
    generated = [tok]
    llama_cpp.llama_perf_context_reset(llm.ctx)
    t0 = time.perf_counter()
    for _ in range(int(spec["decode_tokens"])):
        llm.eval([tok])
        tok = greedy()
        generated.append(tok)
    decode_s = time.perf_counter() - t0
    perf = llama_cpp.llama_perf_context(llm.ctx)
    info = llama_cpp.llama_print_system_info()
    return {
        "cold": cold,
        "prefill_s": prefill,
        "decode_s": decode_s,
        "generated": generated,
        "perf_prefill_s": perf_prefill,
        "perf_decode_s": perf.t_eval_ms / 1e3,
        "perf_decode_n": perf.n_eval,
        "version": llama_cpp.__version__,
        "system_info": info.decode() if isinstance(info, bytes) else str(info),
        **peak_memory(),
    }


def worker_compile(spec: Json) -> Json:
    """zinc's first compile into an empty cache directory: GGUF -> MLIR -> vmfb + manifest."""
    from zinc.compiler.build import ensure_artifact

    events: list[tuple[float, str]] = []
    t0 = time.perf_counter()
    artifact = ensure_artifact(
        Path(spec["gguf"]),
        "cpu",
        progress=lambda msg: events.append((time.perf_counter() - t0, msg)),
        cache_dir=Path(spec["cache_dir"]),
    )
    total = time.perf_counter() - t0
    vmfbs = sorted(artifact.glob("*.vmfb"))
    return {
        "total_s": total,
        "events": events,
        "artifact_dir": str(artifact),
        "vmfb_bytes": sum(p.stat().st_size for p in vmfbs),
        "artifact_bytes": sum(p.stat().st_size for p in artifact.rglob("*") if p.is_file()),
        **peak_memory(),
    }


WORKERS: dict[str, Callable[[Json], Json]] = {
    "zinc": worker_zinc,
    "llama": worker_llama,
    "compile": worker_compile,
}


def run_worker(kind: str, spec: Json, tmp: Path, env: dict[str, str], script: Path | None = None) -> Json:
    """Run one worker (of this file, or of `script`) in a fresh Python process; its result comes
    back through a JSON file."""
    spec_path = tmp / f"spec-{kind}.json"
    result_path = tmp / f"result-{kind}.json"
    result_path.unlink(missing_ok=True)
    before = _cpu_snapshot()
    spec_path.write_text(json.dumps({**spec, "result": str(result_path), "t_spawn": time.monotonic()}))
    proc = subprocess.run(
        [sys.executable, str(script or Path(__file__).resolve()), "--worker", kind, "--spec", str(spec_path)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or not result_path.exists():
        tail = (proc.stderr or proc.stdout)[-2000:]
        raise RuntimeError(f"{kind} worker failed (exit {proc.returncode}):\n{tail}")
    result: Json = json.loads(result_path.read_text())
    result.update(_other_load(before, _cpu_snapshot()))
    return result


def _cpu_snapshot() -> tuple[float, float, float]:
    """(wall clock, CPU seconds busy on the whole machine, CPU seconds used by our finished children)."""
    busy = 0.0
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
        busy = (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # all but idle + iowait
    except (OSError, ValueError, IndexError):
        pass
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.monotonic(), busy, kids.ru_utime + kids.ru_stime


def _other_load(before: tuple[float, float, float], after: tuple[float, float, float]) -> Json:
    """How much of the machine other processes took while a worker ran (the bench's noise level)."""
    wall = after[0] - before[0]
    own = after[2] - before[2]
    other = max(0.0, (after[1] - before[1]) - own)
    cpus = os.cpu_count() or 1
    return {
        "wall_s": wall,
        "own_cpu_s": own,
        "other_cpu_pct": 100 * other / (wall * cpus) if wall > 0 else 0.0,
    }


# --------------------------------------------------------------------------------------------
# Host measurements
# --------------------------------------------------------------------------------------------
def measure_bandwidth(gib: float = 1.0, repeats: int = 7) -> Json:
    """Memory read bandwidth from numpy reductions over a `gib` GiB float64 array: the faster of
    `sum` and `max`, best of `repeats` each.

    Single-threaded (one reduction), and with THREADS threads each reducing its own slice (numpy
    releases the GIL inside the reduction). Both reductions, because either alone can fall short
    of the memory's speed: numpy's pairwise float `sum` is bound by its additions on some CPUs (an
    Intel Xeon: 9 GB/s a core, where its SIMD `max` and a plain AVX-512 read loop in C read 12-13),
    and taking the faster never lowers the ceiling below what a `sum` alone gave.
    """
    import numpy as np

    a = np.ones(int(gib * (1 << 30)) // 8, dtype=np.float64)
    slices = np.array_split(a, THREADS)

    def best(reduce: Callable[[np.ndarray], object], parts: list[np.ndarray]) -> float:
        times = []
        for _ in range(repeats):
            threads = [threading.Thread(target=reduce, args=(part,)) for part in parts]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            times.append(time.perf_counter() - t0)
        return a.nbytes / min(times) / 1e9

    def fastest(parts: list[np.ndarray]) -> float:
        return max(best(np.sum, parts), best(np.max, parts))

    return {
        "array_bytes": int(gib * (1 << 30)),
        "repeats": repeats,
        "method": "numpy sum or max, the faster",
        "gbps_1t": fastest([a]),
        f"gbps_{THREADS}t": fastest(slices),
    }


def cpu_info() -> Json:
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if ":" in line:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = set(fields.get("flags", "").split())
    simd = [f for f in ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                        "avx512_bf16", "avx_vnni", "amx_tile") if f in flags]  # fmt: skip
    return {
        "model": fields.get("model name", platform.processor() or "unknown"),
        "family_model": f"family {fields.get('cpu family', '?')} model {fields.get('model', '?')}",
        "cache": fields.get("cache size", "?"),
        "logical_cpus": os.cpu_count() or 0,
        "usable_cpus": len(os.sched_getaffinity(0)),
        "simd": simd,
        "kernel": platform.release(),
        "mem_total_gib": _mem_total_gib(),
    }


def _mem_total_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / (1 << 20)
    except OSError:
        pass
    return 0.0


def versions() -> Json:
    from importlib import metadata

    import iree.runtime.version as rt_version
    import numpy as np

    from zinc.compiler.build import zinc_version
    from zinc.compiler.targets import compiler_version

    def dist(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return {
        "zinc": zinc_version(),
        "iree_compiler": compiler_version(),
        "iree_runtime": str(getattr(rt_version, "VERSION", "unknown")),
        "llama_cpp_python": dist("llama_cpp_python"),
        "numpy": np.__version__,
        "python": platform.python_version(),
    }


def make_prompts(gguf: Path, lengths: Sequence[int]) -> dict[int, list[int]]:
    """Token-id prompts of exactly each length, from repeated English text (the same ids for both engines)."""
    from zinc.model.gguf_file import open_gguf
    from zinc.tokenizer import Tokenizer

    tok = Tokenizer.from_metadata(open_gguf(gguf).metadata)
    need = max(lengths)
    text = PROMPT_TEXT
    ids = tok.encode(text)
    while len(ids) < need:
        text += PROMPT_TEXT
        ids = tok.encode(text)
    return {n: ids[:n] for n in lengths}


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------
def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def fmt(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None or x != x else f"{x:,.{digits}f}"


def ratio(z: float | None, ll: float | None) -> str:
    if z is None or ll is None or ll == 0 or z != z or ll != ll:
        return "n/a"
    r = z / ll
    return f"{r:.3f}×" if r < 10 else f"{r:.1f}×"


def summarize(zinc_runs: list[Json], llama_runs: list[Json], lengths: Sequence[int], n_decode: int) -> Json:
    def engine(runs: list[Json]) -> Json:
        if not runs:
            return {}
        out: Json = {}
        for n in lengths:
            out[f"prefill_{n}"] = median([n / r["prefill_s"][str(n)] for r in runs])
        out["decode"] = median([n_decode / r["decode_s"] for r in runs])
        out["cold"] = median([r["cold"]["total_s"] for r in runs])
        for phase in ("python_start_s", "import_s", "cache_lookup_s", "open_s", "prefill_s"):
            values = [r["cold"][phase] for r in runs if phase in r["cold"]]
            out[f"cold_{phase}"] = median(values) if values else None
        out["mem"] = median([r["vmhwm_mib"] for r in runs])
        with_matcher = [r["vmhwm_constrained_mib"] for r in runs if r.get("vmhwm_constrained_mib")]
        out["mem_constrained"] = median(with_matcher) if with_matcher else None
        cons = [r["constrained"] for r in runs if r.get("constrained") and r["constrained"]["tokens"] > 0]
        out["constrained"] = median([c["tokens"] / c["seconds"] for c in cons]) if cons else None
        out["other_cpu"] = median([r["other_cpu_pct"] for r in runs])
        return out

    return {"zinc": engine(zinc_runs), "llama": engine(llama_runs)}


def agreement(zinc_runs: list[Json], llama_runs: list[Json]) -> str:
    if not zinc_runs or not llama_runs:
        return "n/a"
    a, b = zinc_runs[0]["generated"], llama_runs[0]["generated"]
    same = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        same += 1
    return f"{same} of {min(len(a), len(b))}"


def rounded(value: Any, digits: int = 3) -> Any:
    """`value` with every float rounded, for a readable JSON dump."""
    if isinstance(value, float):
        return round(value, digits)
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [rounded(v, digits) for v in value]
    return value


def render(data: Json, notes: str) -> str:
    m = data["summary"]
    z, ll = m["zinc"], m["llama"]
    bw = data["bandwidth"]
    bw_best = max(bw["gbps_1t"], bw[f"gbps_{THREADS}t"])
    weight_bytes = data["weight_bytes"]
    ceiling = bw_best * 1e9 / weight_bytes
    comp = data["compile"]
    cpu = data["cpu"]
    ver = data["versions"]
    lengths: list[int] = data["lengths"]
    n_decode = data["decode_tokens"]
    llama_info = data.get("llama_system_info") or "(llama.cpp not measured)"

    def row(name: str, key: str, better: str, digits: int = 1) -> str:
        zv, lv = z.get(key), ll.get(key)
        return f"| {name} | {better} | {fmt(zv, digits)} | {fmt(lv, digits)} | {ratio(zv, lv)} |"

    rows = [row(f"Prefill, {n}-token prompt (tok/s)", f"prefill_{n}", "higher") for n in lengths]
    rows += [
        row(f"Decode, {n_decode} tokens greedy (tok/s)", "decode", "higher", 2),
        row("Decode under a JSON Schema, llguidance mask per token (tok/s)", "constrained", "higher", 2),
        row("Cold start to first token (s)", "cold", "lower", 2),
        row("Peak resident memory: model, tokenizer, KV cache (VmHWM, MiB)", "mem", "lower"),
        row("… and then a JSON Schema matcher (llguidance), for the constrained decode (MiB)", "mem_constrained",
            "lower"),
        f"| *Noise: CPU taken by other processes during the run (% of all CPUs)* | lower | "
        f"{fmt(z.get('other_cpu'), 0)} % | {fmt(ll.get('other_cpu'), 0)} % | |",
    ]

    phases = [
        ("Python interpreter start", "cold_python_start_s"),
        ("Imports (engine + its runtime)", "cold_import_s"),
        ("Open the model (zinc: the artifact cache lookup below, the session, the tokenizer)", "cold_open_s"),
        (
            "… zinc artifact cache lookup (`ensure_artifact`: GGUF header, source hash, manifest check)",
            "cold_cache_lookup_s",
        ),
        (f"Prefill {COLD_PROMPT_TOKENS} tokens + first token (first call)", "cold_prefill_s"),
    ]
    cold_rows = [f"| {name} | {fmt(z.get(key), 2)} | {fmt(ll.get(key), 2)} |" for name, key in phases]

    def pct(v: float | None) -> str:
        return "n/a" if v is None else f"{100 * v / ceiling:.1f} %"

    raw = {
        "zinc": [
            {"prefill_s": r["prefill_s"], "decode_s": round(r["decode_s"], 3), "cold": r["cold"], "vmhwm_mib": r["vmhwm_mib"],
             "other_cpu_pct": r["other_cpu_pct"]}
            for r in data["zinc_runs"]
        ],
        "llama.cpp": [
            {"prefill_s": r["prefill_s"], "decode_s": round(r["decode_s"], 3), "cold": r["cold"], "vmhwm_mib": r["vmhwm_mib"],
             "other_cpu_pct": r["other_cpu_pct"], "llama_perf_prefill_s": r["perf_prefill_s"], "llama_perf_decode_s": r["perf_decode_s"]}
            for r in data["llama_runs"]
        ],
        "compile": [{k: c[k] for k in ("total_s", "vmfb_bytes", "vmhwm_mib")} for c in comp],
    }  # fmt: skip

    load = data["loadavg"]
    lines = [
        f"# {data['title']}",
        "",
        "Generated by `bench/bench.py`; everything above **Notes** is rewritten on each run.",
        "",
        f"- **Date:** {data['date']}",
        f"- **Machine:** {cpu['model']} ({cpu['family_model']}, cache {cpu['cache']}), "
        f"{cpu['logical_cpus']} logical CPUs ({cpu['usable_cpus']} usable), {cpu['mem_total_gib']:.1f} GiB RAM, "
        f"Linux {cpu['kernel']}; SIMD: {', '.join(cpu['simd']) or 'none listed'}",
        f"- **Load average** (1/5/15 min) at start {load['start']}, at end {load['end']}"
        + (" — **the machine was busy: expect noisy numbers**" if load["busy"] else ""),
        f"- **Versions:** zinc {ver['zinc']}, IREE compiler {ver['iree_compiler']} / runtime {ver['iree_runtime']}, "
        f"llama-cpp-python {ver['llama_cpp_python']}, numpy {ver['numpy']}, Python {ver['python']}",
        f"- **llama.cpp system info:** `{llama_info.strip()}`",
        f"- **Model:** `{data['model']}` ({data['model_bytes'] / 1e6:.1f} MB file, "
        f"{weight_bytes / 1e6:.1f} MB of tensors)",
        f"- **Setup:** CPU, {THREADS} threads for both engines (zinc: IREE `{data['driver']}` driver"
        + (f" with {THREADS} unpinned workers, `--threads {THREADS}`" if data["driver"] == "local-task" else "")
        + f"; llama.cpp: `n_threads={THREADS}, n_threads_batch={THREADS}, n_ctx={CONTEXT}, n_batch=512`), "
        f"context {CONTEXT} for both, greedy decoding, {data['runs']} run(s) per measurement"
        + (" (`--quick`)" if data["quick"] else "")
        + ", **medians** reported.",
        "",
        "## Results",
        "",
        "Ratio = zinc / llama.cpp: above 1× zinc is faster for throughput; below 1× zinc is better "
        "for time and memory.",
        "",
        "| Metric | Better | zinc | llama.cpp | zinc / llama.cpp |",
        "|---|---|---:|---:|---:|",
        *rows,
        "",
        "Cold start, phase by phase (medians, seconds):",
        "",
        "| Phase | zinc | llama.cpp |",
        "|---|---:|---:|",
        *cold_rows,
        "",
        f"Greedy tokens identical from the start of the decode run: {agreement(data['zinc_runs'], data['llama_runs'])} "
        "(a sanity check that both engines run the same model; small numeric differences may make them "
        "diverge later).",
        "",
        "## Memory bandwidth and the decode ceiling",
        "",
        f"- **Read bandwidth** (numpy `sum` or `max` over a {bw['array_bytes'] / (1 << 30):.0f} GiB float64 array, "
        f"best of {bw['repeats']}): {bw['gbps_1t']:.1f} GB/s on 1 thread, {bw[f'gbps_{THREADS}t']:.1f} GB/s "
        f"on {THREADS} threads (each reducing half; the faster of the two reductions).",
        f"- **Weight bytes read per token:** {weight_bytes / 1e6:.1f} MB (sum of the GGUF tensor sizes; "
        "the embedding table is tied to the output projection, so all of it is read for the logits).",
        f"- **Bandwidth-bound decode ceiling:** {bw_best:.1f} GB/s / {weight_bytes / 1e6:.1f} MB = "
        f"**{ceiling:.0f} tok/s** (ignores the KV cache and activations, so it is an upper bound).",
        f"- **Share of the ceiling reached:** zinc {pct(z.get('decode'))}, llama.cpp {pct(ll.get('decode'))}.",
        "",
        "## Compile (zinc only)",
        "",
        f"- **First compile** into an empty cache (GGUF → MLIR → `iree-compile` → vmfb + manifest), "
        f"median of {len(comp)}: **{median([c['total_s'] for c in comp]):.1f} s**, peak memory "
        f"{median([c['vmhwm_mib'] for c in comp]):.0f} MiB (other processes took "
        f"{median([c['other_cpu_pct'] for c in comp]):.0f} % of the CPUs meanwhile).",
        f"- **Artifact:** {comp[0]['vmfb_bytes'] / 1e6:.2f} MB `.vmfb`, {comp[0]['artifact_bytes'] / 1e6:.2f} MB "
        "artifact directory: on the CPU it holds `weights.irpa`, the matmul weights repacked into tiled planes "
        "(a byte shuffle of the GGUF blocks, same size); the rest is bound from the GGUF at load time.",
        "",
        "## What is measured",
        "",
        "- **Prefill:** one call on the whole prompt (zinc `session.prefill(ids)`, llama.cpp `Llama.eval(ids)` "
        "after `reset()`), timed until the greedy next token is on the host; tok/s = prompt length / time. "
        "Both engines get the same token ids (repeated English text, cut to length).",
        f"- **Decode:** after prefilling the {data['decode_prompt_len']}-token prompt, {n_decode} single-token steps "
        "(zinc `generate_ids`, as `zinc --prompt` runs it: `session.decode`, then `session.decode_after`, each step "
        "enqueued before the token of the one before is read, as `zinc serve` runs them too; llama.cpp "
        "`eval([token])` + argmax of the logits), timed together.",
        "- **Cold start:** wall time from spawning a new Python process to the first generated token of a "
        f"{COLD_PROMPT_TOKENS}-token prompt, with the compiled artifact already cached and the model file in the "
        "page cache: interpreter start, imports, opening the model (zinc: cache lookup, loading the vmfb "
        "and its parameter archive, building the tokenizer), prefill.",
        "- **Decode under a JSON Schema** (zinc only): the same greedy decode through `generate_tokens` with an "
        "llguidance matcher for `{story: string}`: each step reads the logits back, masks them and takes the "
        "argmax. Compare with the plain decode row for the cost of structured output.",
        "- **Peak memory:** VmHWM of that same process after every measurement above except the constrained "
        "decode (the 512-token prefill included): the model, its tokenizer (zinc builds its `Tokenizer` while "
        "opening; llama.cpp loads its vocabulary) and the KV cache, zinc's in float16 on the CPU "
        f"({CONTEXT} positions), llama.cpp's in float16. The second memory row is zinc's VmHWM after the "
        "constrained decode as well, which llama.cpp's run has no counterpart for: llguidance's view of the "
        "vocabulary, with its token-set slices that keep a mask under a millisecond.",
        "- One fresh process per engine per run; zinc and llama.cpp alternate which goes first. Warm-up "
        f"(one prefill and {WARMUP_DECODE} decode steps) is not timed.",
        "- **Noise:** the share of the machine's CPU time that other processes used while each worker ran "
        "(from /proc/stat, minus the worker's own CPU time). When it is high the throughput numbers do not "
        "describe the engines, llama.cpp's especially: it is built with OpenMP, whose threads wait for each "
        "other at every operation, so one thread losing its core to another process stalls both.",
        "",
        "<details><summary>Raw per-run numbers (seconds)</summary>",
        "",
        "```json",
        json.dumps(rounded(raw), indent=1),
        "```",
        "",
        "</details>",
        "",
        "## How to reproduce",
        "",
        "```sh",
        "# optional: the llama.cpp build used for comparison (native, with AVX2)",
        "bash scripts/bench                           # builds llama-cpp-python natively if missing, then everything",
        ".venv/bin/python bench/bench.py              # full: 3 runs, 128 + 512 prompts, 128 decode tokens (~10-20 min)",
        ".venv/bin/python bench/bench.py --model gemma3-270m --out /tmp/gemma.md",
        ".venv/bin/python bench/bench.py --quick      # 1 run, 128 prompt, 16 decode tokens (a few minutes)",
        ".venv/bin/python bench/bench.py --runs 5 --out /tmp/perf.md",
        "```",
        "",
        "Run it on an otherwise idle machine: both engines are bound by 2 cores and memory bandwidth.",
        "",
        notes.rstrip() + "\n",
    ]
    return "\n".join(lines)


def existing_notes(out: Path) -> str:
    """The `## Notes` section of the current report (kept verbatim), or a fresh empty one."""
    if out.exists():
        found = re.search(rf"^{re.escape(NOTES_HEADING)}[ \t]*$", out.read_text(), re.MULTILINE)
        if found:
            return out.read_text()[found.start() :]
    return f"{NOTES_HEADING}\n\nWhat today's figures mean, by hand; `bench/bench.py` keeps this section as it is.\n"


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="1 run, the 128-token prompt only, 16 decode tokens")
    ap.add_argument(
        "--runs", type=int, default=None, help="repetitions of every measurement (default 3; 1 with --quick)"
    )
    ap.add_argument(
        "--decode-tokens", type=int, default=None, help="tokens to decode (default 128; 16 with --quick)"
    )
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "PERFORMANCE.md")
    ap.add_argument("--driver", choices=("local-task", "local-sync"), default="local-task",
                    help="zinc's IREE CPU driver (local-sync is single-threaded)")  # fmt: skip
    ap.add_argument("--no-llama", action="store_true", help="skip llama.cpp")
    ap.add_argument("--model", default="smollm2", help="model name or .gguf path (default: the bundled SmolLM2)")
    ap.add_argument("--compile-runs", type=int, default=None, help="first-compile repetitions (default: --runs)")
    ap.add_argument("--title", default=None, help="report heading (default: from the model)")
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        spec = json.loads(args.spec.read_text())
        result = WORKERS[args.worker](spec)
        Path(spec["result"]).write_text(json.dumps(result))
        return 0

    from zinc.model.gguf_file import open_gguf, resolve_model

    runs = args.runs or (1 if args.quick else 3)
    n_decode = args.decode_tokens or (16 if args.quick else 128)
    lengths = [128] if args.quick else [128, 512]
    gguf_path = resolve_model(args.model)
    gguf = open_gguf(gguf_path)
    weight_bytes = sum(t.n_bytes for t in gguf.tensors.values())
    load_start = os.getloadavg()
    t_all = time.perf_counter()

    llama_ok = not args.no_llama
    if llama_ok:
        try:
            import importlib.util

            llama_ok = importlib.util.find_spec("llama_cpp") is not None
        except ValueError:
            llama_ok = False
        if not llama_ok:
            say("llama_cpp is not installed: measuring zinc only")

    say(f"model {gguf_path.name}: {weight_bytes / 1e6:.1f} MB of tensors; {runs} run(s), "
        f"prompts {lengths}, {n_decode} decode tokens, zinc driver {args.driver}")  # fmt: skip
    say("measuring memory bandwidth (numpy, 1 GiB)")
    bw = measure_bandwidth()
    say(
        f"bandwidth: {bw['gbps_1t']:.1f} GB/s (1 thread), {bw[f'gbps_{THREADS}t']:.1f} GB/s ({THREADS} threads)"
    )

    prompts = make_prompts(gguf_path, [*lengths, COLD_PROMPT_TOKENS])
    spec_common: Json = {
        "gguf": str(gguf_path),
        "threads": THREADS,
        "driver": args.driver,
        "prompts": {str(n): prompts[n] for n in lengths},
        "decode_prompt": prompts[128],
        "cold_ids": prompts[COLD_PROMPT_TOKENS],
        "decode_tokens": n_decode,
        "constrained_tokens": 0 if args.quick else 64,
    }

    with tempfile.TemporaryDirectory(prefix="zinc-bench-") as tmp_name:
        tmp = Path(tmp_name)
        env = {**os.environ, "ZINC_CACHE": str(tmp / "cache0"), "OMP_NUM_THREADS": str(THREADS)}
        compiles: list[Json] = []
        compile_runs = args.compile_runs if args.compile_runs is not None else runs
        for i in range(max(compile_runs, 1)):
            say(f"compile {i + 1}/{compile_runs}: zinc into an empty cache (about a minute)")
            c = run_worker("compile", {**spec_common, "cache_dir": str(tmp / f"cache{i}")}, tmp, env)
            compiles.append(c)
            say(f"  compiled in {c['total_s']:.1f} s, vmfb {c['vmfb_bytes'] / 1e6:.2f} MB")

        zinc_runs: list[Json] = []
        llama_runs: list[Json] = []
        for i in range(runs):
            order = ["zinc", "llama"] if i % 2 == 0 else ["llama", "zinc"]
            for kind in order:
                if kind == "llama" and not llama_ok:
                    continue
                say(f"run {i + 1}/{runs}: {'zinc' if kind == 'zinc' else 'llama.cpp'}")
                r = run_worker(kind, {**spec_common, "cache_dir": str(tmp / "cache0")}, tmp, env)
                (zinc_runs if kind == "zinc" else llama_runs).append(r)
                pre = ", ".join(f"{n}: {n / r['prefill_s'][str(n)]:.1f}" for n in lengths)
                say(f"  prefill tok/s {pre}; decode {n_decode / r['decode_s']:.2f} tok/s; "
                    f"cold start {r['cold']['total_s']:.2f} s; peak {r['vmhwm_mib']:.0f} MiB; "
                    f"other processes took {r['other_cpu_pct']:.0f} % of the CPUs")  # fmt: skip

    load_end = os.getloadavg()
    data: Json = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_info(),
        "versions": versions(),
        "llama_system_info": llama_runs[0]["system_info"] if llama_runs else None,
        "loadavg": {
            "start": " / ".join(f"{x:.2f}" for x in load_start),
            "end": " / ".join(f"{x:.2f}" for x in load_end),
            "busy": max(load_start[0], load_end[0]) > 0.5,
        },
        "model": gguf_path.name,
        "model_bytes": gguf.file_size,
        "weight_bytes": weight_bytes,
        "bandwidth": bw,
        "compile": compiles,
        "zinc_runs": zinc_runs,
        "llama_runs": llama_runs,
        "summary": summarize(zinc_runs, llama_runs, lengths, n_decode),
        "lengths": lengths,
        "decode_tokens": n_decode,
        "decode_prompt_len": 128,
        "runs": runs,
        "title": args.title or f"Performance: zinc vs llama.cpp ({gguf_path.name})",
        "quick": args.quick,
        "driver": args.driver,
    }
    out: Path = args.out
    notes = existing_notes(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(data, notes))
    say(f"wrote {out} in {time.perf_counter() - t_all:.0f} s")
    s = data["summary"]
    for key in [*(f"prefill_{n}" for n in lengths), "decode", "constrained", "cold", "mem"]:
        zv, lv = s["zinc"].get(key), s["llama"].get(key)
        print(f"{key:12s} zinc {fmt(zv, 2):>10s}  llama.cpp {fmt(lv, 2):>10s}  ratio {ratio(zv, lv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
