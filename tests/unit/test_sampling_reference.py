"""zinc's sampler (runtime/sampling.py) against a numpy reference of its documented pipeline.

The pipeline, as runtime/sampling.py documents it, per token:
1. each `logit_bias` is added to its token's logit; then the penalties, over the last 64 tokens of
   the sequence (prompt and generated): `repeat_penalty` divides a positive logit of a token seen
   there and multiplies a negative one, `frequency_penalty` x its count and `presence_penalty`
   (once) are subtracted;
2. a constraint's mask removes disallowed tokens;
3. temperature 0 is greedy (the argmax of what is left); otherwise logits / temperature, softmax;
4. top-k keeps the k most likely (ties by lower id), renormalized;
5. top-p and min-p judge that distribution: a token stays if it is in the smallest prefix, most
   likely first, whose sum reaches top_p, and its probability is at least min_p x the largest;
6. one draw from what stays, renormalized.

How that differs from llama.cpp's default sampler chain (common/common.h `samplers`: logit_bias,
then penalties, dry, top_n_sigma, top_k, typical_p, top_p, min_p, xtc, temperature, dist):
llama.cpp divides by the temperature LAST, after top-p and min-p have cut the untempered
distribution; zinc divides first (as Hugging Face transformers and vLLM do), so for a
temperature other than 1, top-p and min-p keep a different set of tokens than llama.cpp's. The
rest agrees: the penalty window is llama.cpp's default `repeat_last_n` of 64 tokens with the
prompt counted (llama-server feeds the prompt to the sampler), and top-p then min-p on what is
left is the same set as zinc's "both judge the same distribution" (min-p is a ratio to the
largest, which renormalizing does not change). DRY, top-n-sigma, typical-p and XTC are not
offered.

`reference_distribution` below is that pipeline written out plainly (a loop per step, float64),
apart from the sampler's vectorized code. The sampler's draws at a fixed seed are compared with
it by a chi-square goodness-of-fit test: deterministic (the seed fixes the draws), at a
significance level of 1e-3, and with N = 10,000 draws a real bug is far past it: top-p keeping
one token too few drops a token the reference gives 3% or more (chi-square about 300, p < 1e-60),
one too many draws a token the reference never gives (the support check), temperature ignored or
divided after the truncations (llama.cpp's order) gives chi-square 400 to 3,000, where the
unbroken sampler's configs give p from 0.09 to 0.99. `test_the_chi_square_test_catches_mutated_samplers`
runs such mutations and shows each failing. The real engine's part (a seed gives the same tokens on a rerun and whatever else is
batched with it) is the last test here, on the bundled SmolLM2.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from zinc.runtime.sampling import PENALTY_LAST_N, Sampler, SamplingParams

Probs = np.ndarray[Any, np.dtype[np.float64]]
DRAWS = 10_000
ALPHA = 1e-3  # the chi-square test's significance level
WINDOW = 64  # the penalty window the pipeline documents (llama.cpp's repeat_last_n default)
VOCAB = 40
LOGITS = (np.random.default_rng(38).standard_normal(VOCAB) * 1.6).astype(np.float32)


def reference_distribution(
    logits: np.ndarray, params: SamplingParams, history: Sequence[int] = (), allowed: np.ndarray | None = None
) -> Probs:
    """The probability of each token under the documented pipeline (module docstring)."""
    x = [float(v) for v in logits]
    for tok, bias in params.logit_bias.items():  # 1. logit bias, then penalties over the window
        x[tok] += bias
    window = list(history)[-WINDOW:]
    for tok in sorted(set(window)):
        count = window.count(tok)
        v = x[tok]
        v = v / params.repeat_penalty if v > 0 else v * params.repeat_penalty
        x[tok] = v - count * params.frequency_penalty - params.presence_penalty
    live = [allowed is None or bool(allowed[i]) for i in range(len(x))]  # 2. the mask
    out = np.zeros(len(x))
    if params.temperature == 0:  # 3. greedy: the first of the largest
        best = max((i for i in range(len(x)) if live[i]), key=lambda i: (x[i], -i))
        out[best] = 1.0
        return out
    z = [v / params.temperature for v in x]
    top = max(z[i] for i in range(len(z)) if live[i])
    e = [math.exp(z[i] - top) if live[i] else 0.0 for i in range(len(z))]
    p = [v / sum(e) for v in e]
    order = sorted(range(len(p)), key=lambda i: (-p[i], i))  # 4. top-k
    if params.top_k > 0:
        order = order[: params.top_k]
    total = sum(p[i] for i in order)
    q = [p[i] / total for i in order]
    kept, cumulative = [], 0.0  # 5. top-p and min-p on the top-k distribution
    for rank, tok in enumerate(order):
        if q[rank] < params.min_p * q[0]:
            break
        kept.append(tok)
        cumulative += q[rank]
        if params.top_p < 1.0 and cumulative >= params.top_p:
            break
    for tok in kept:  # 6. renormalized over what stays
        out[tok] = p[tok]
    return out / out.sum()


def chi2_sf(stat: float, df: int) -> float:
    """P(X >= stat) for X chi-square with `df` degrees of freedom: the regularized upper
    incomplete gamma function Q(df/2, stat/2) (series below a + 1, continued fraction above)."""
    a, x = df / 2.0, stat / 2.0
    if x <= 0:
        return 1.0
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        n = a
        while abs(term) > abs(total) * 1e-15:
            n += 1
            term *= x / n
            total += term
        return max(0.0, 1.0 - total * math.exp(log_front))
    tiny = 1e-300
    b = x + 1.0 - a
    c, d = 1.0 / tiny, 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return math.exp(log_front) * h


def goodness_of_fit(counts: np.ndarray, probs: Probs) -> tuple[float, int, float]:
    """Pearson's chi-square of observed `counts` against `probs`: (statistic, df, p-value). Tokens
    expected fewer than 5 times are pooled into one bin, so every bin expects at least 5."""
    n = counts.sum()
    support = [i for i in np.argsort(-probs, kind="stable") if probs[i] > 0]
    bins: list[tuple[float, float]] = []
    pooled_o = pooled_e = 0.0
    for i in support:
        expected = n * probs[i]
        if expected >= 5:
            bins.append((float(counts[i]), expected))
        else:
            pooled_o, pooled_e = pooled_o + counts[i], pooled_e + expected
    if pooled_e > 0:
        if pooled_e >= 5 or not bins:
            bins.append((pooled_o, pooled_e))
        else:  # too small on its own: merge into the smallest bin
            o, e = bins.pop()
            bins.append((o + pooled_o, e + pooled_e))
    stat = sum((o - e) ** 2 / e for o, e in bins)
    df = len(bins) - 1
    return stat, df, (chi2_sf(stat, df) if df > 0 else 1.0)


History = list[int]
# (name, params, history, allowed): every control alone and together, over LOGITS
REPEATS = [int(t) for t in np.argsort(-LOGITS)[:6]]  # the six most likely tokens
NEGATIVE = [int(t) for t in np.argsort(LOGITS)[:3]]  # three with negative logits
CONFIGS: list[tuple[str, SamplingParams, History, np.ndarray | None]] = [
    ("temperature 1", SamplingParams(temperature=1.0, seed=1), [], None),
    ("temperature 0.7", SamplingParams(temperature=0.7, seed=2), [], None),
    ("temperature 1.8", SamplingParams(temperature=1.8, seed=3), [], None),
    ("top_k 7", SamplingParams(temperature=1.3, top_k=7, seed=4), [], None),
    ("top_p 0.8", SamplingParams(temperature=1.0, top_p=0.8, seed=5), [], None),
    ("top_p 0.6 at 0.7", SamplingParams(temperature=0.7, top_p=0.6, seed=6), [], None),
    ("min_p 0.08", SamplingParams(temperature=1.0, min_p=0.08, seed=7), [], None),
    ("min_p 0.2 at 1.5", SamplingParams(temperature=1.5, min_p=0.2, seed=80), [], None),
    (
        "top_k, top_p and min_p",
        SamplingParams(temperature=1.2, top_k=12, top_p=0.9, min_p=0.05, seed=9),
        [],
        None,
    ),
    (
        "repeat_penalty 1.5",
        SamplingParams(temperature=1.0, repeat_penalty=1.5, seed=10),
        REPEATS + NEGATIVE,
        None,
    ),
    (
        "frequency and presence",
        SamplingParams(temperature=1.0, frequency_penalty=0.4, presence_penalty=0.3, seed=11),
        [REPEATS[0]] * 3 + [REPEATS[1]] * 2 + REPEATS[2:4],
        None,
    ),
    (
        "penalties over the last 64 tokens only",
        SamplingParams(temperature=1.0, repeat_penalty=1.4, frequency_penalty=0.2, seed=12),
        [REPEATS[0]] * 30 + [REPEATS[1]] * 60 + [REPEATS[2]] * 4,
        None,
    ),
    (
        "logit_bias",
        SamplingParams(temperature=1.0, logit_bias={REPEATS[0]: -100.0, NEGATIVE[0]: 4.0}, seed=13),
        [],
        None,
    ),
    (
        "everything and a mask",
        SamplingParams(
            temperature=0.9,
            top_k=20,
            top_p=0.95,
            min_p=0.02,
            repeat_penalty=1.2,
            presence_penalty=0.2,
            frequency_penalty=0.1,
            logit_bias={NEGATIVE[1]: 3.0},
            seed=14,
        ),
        REPEATS[:3] * 2,
        np.arange(VOCAB) % 3 != 1,
    ),
]
CONFIG_IDS = [c[0] for c in CONFIGS]


def draws(
    sample: Callable[[np.ndarray, Sequence[int], np.ndarray | None], int],
    history: History,
    allowed: np.ndarray | None,
    n: int = DRAWS,
) -> np.ndarray:
    counts = np.zeros(VOCAB, dtype=np.int64)
    for _ in range(n):
        counts[sample(LOGITS, history, allowed)] += 1
    return counts


def fits(counts: np.ndarray, probs: Probs) -> tuple[bool, str]:
    outside = [int(i) for i in np.flatnonzero((counts > 0) & (probs == 0))]
    stat, df, p = goodness_of_fit(counts, probs)
    why = f"chi2 {stat:.1f} on {df} df, p {p:.3g}; drawn outside the support: {outside}"
    return not outside and p >= ALPHA, why


def test_chi_square_survival_function_matches_known_values() -> None:
    # textbook critical values: P(X >= x) for X ~ chi2(df)
    for stat, df, p in [(3.841, 1, 0.05), (6.635, 1, 0.01), (18.307, 10, 0.05), (29.588, 10, 0.001),
                        (124.342, 100, 0.05), (0.0158, 1, 0.9), (2.558, 10, 0.99)]:  # fmt: skip
        assert chi2_sf(stat, df) == pytest.approx(p, rel=2e-3), (stat, df)


def test_the_reference_has_clear_boundaries() -> None:
    """No config sits on a knife edge: at the top-p and min-p boundaries the reference is 1e-3
    or more from flipping, so float rounding cannot decide which tokens stay."""
    for name, params, history, allowed in CONFIGS:
        probs = reference_distribution(LOGITS, params, history, allowed)
        assert np.count_nonzero(probs) >= 3, name
        unbounded = replace(params, top_p=1.0, min_p=0.0, top_k=0)
        full = reference_distribution(LOGITS, unbounded, history, allowed)
        q = np.sort(full)[::-1]
        if params.top_k:
            q = q[: params.top_k] / q[: params.top_k].sum()
        if params.top_p < 1.0:
            assert np.min(np.abs(np.cumsum(q) - params.top_p)) > 1e-3, name
        if params.min_p > 0:
            assert np.min(np.abs(q - params.min_p * q[0])) > 1e-3 * q[0], name


@pytest.mark.parametrize(("name", "params", "history", "allowed"), CONFIGS, ids=CONFIG_IDS)
def test_sampler_draws_follow_the_reference_distribution(
    name: str, params: SamplingParams, history: History, allowed: np.ndarray | None
) -> None:
    probs = reference_distribution(LOGITS, params, history, allowed)
    counts = draws(Sampler(params).sample, history, allowed)
    ok, why = fits(counts, probs)
    assert ok, f"{name}: {why}"


def test_greedy_is_the_argmax_after_bias_penalties_and_mask() -> None:
    history = REPEATS[:2] * 2
    allowed = np.arange(VOCAB) != REPEATS[2]
    params = SamplingParams(repeat_penalty=1.6, logit_bias={NEGATIVE[0]: 1.0}, presence_penalty=0.5)
    expected = int(np.argmax(reference_distribution(LOGITS, params, history, allowed)))
    assert expected not in (*REPEATS[:3], int(np.argmax(LOGITS)))  # the controls did move it
    assert Sampler(params).sample(LOGITS, history, allowed) == expected
    assert Sampler(SamplingParams()).sample(LOGITS) == int(np.argmax(LOGITS))


def test_a_seed_gives_the_same_tokens_on_a_rerun() -> None:
    params = SamplingParams(temperature=1.1, top_p=0.95, seed=1234)
    rng = np.random.default_rng(5)
    rows = [(rng.standard_normal(VOCAB) * 2).astype(np.float32) for _ in range(200)]

    def run(p: SamplingParams) -> list[int]:
        sampler = Sampler(p)
        return [sampler.sample(row, ()) for row in rows]

    first = run(params)
    assert run(params) == first
    assert run(replace(params, seed=1235)) != first
    assert len(set(first)) > 10  # it did sample


def adjusted(params: SamplingParams, history: Sequence[int]) -> np.ndarray:
    return Sampler(params).adjust(LOGITS, history)


def test_each_penalty_and_the_bias_change_only_what_they_should() -> None:
    """Each control alone: the tokens it names move by exactly its amount, every other logit is
    bit for bit the same, and the input is left alone."""
    before = LOGITS.copy()
    untouched = np.ones(VOCAB, dtype=bool)
    pos, neg = REPEATS[0], NEGATIVE[0]
    assert LOGITS[pos] > 0 > LOGITS[neg]

    bias = adjusted(SamplingParams(logit_bias={pos: -2.5, neg: 1.0}), [])
    assert bias[pos] == pytest.approx(LOGITS[pos] - 2.5) and bias[neg] == pytest.approx(LOGITS[neg] + 1.0)
    assert np.array_equal(bias[untouched & ~np.isin(np.arange(VOCAB), [pos, neg])],
                          LOGITS[~np.isin(np.arange(VOCAB), [pos, neg])])  # fmt: skip

    history = [pos, neg, pos, pos]
    seen = np.isin(np.arange(VOCAB), history)
    repeat = adjusted(SamplingParams(repeat_penalty=2.0), history)
    assert repeat[pos] == pytest.approx(LOGITS[pos] / 2.0)  # a positive logit is divided
    assert repeat[neg] == pytest.approx(LOGITS[neg] * 2.0)  # a negative one multiplied
    assert np.array_equal(repeat[~seen], LOGITS[~seen])

    frequency = adjusted(SamplingParams(frequency_penalty=0.5), history)
    assert frequency[pos] == pytest.approx(LOGITS[pos] - 1.5)  # three times
    assert frequency[neg] == pytest.approx(LOGITS[neg] - 0.5)
    assert np.array_equal(frequency[~seen], LOGITS[~seen])

    presence = adjusted(SamplingParams(presence_penalty=0.7), history)
    assert presence[pos] == pytest.approx(LOGITS[pos] - 0.7)  # once, however often
    assert presence[neg] == pytest.approx(LOGITS[neg] - 0.7)
    assert np.array_equal(presence[~seen], LOGITS[~seen])

    negative = adjusted(SamplingParams(frequency_penalty=-1.0, presence_penalty=-0.5), history)
    assert negative[pos] == pytest.approx(LOGITS[pos] + 3.5)  # negative penalties encourage

    assert np.array_equal(adjusted(SamplingParams(), history), LOGITS)  # nothing asked, nothing moves
    assert np.array_equal(LOGITS, before)


def test_penalties_count_only_the_last_64_tokens() -> None:
    assert PENALTY_LAST_N == WINDOW
    old, recent = REPEATS[0], REPEATS[1]
    history = [old] * 10 + [recent] * WINDOW  # `old` is just out of the window
    out = adjusted(SamplingParams(repeat_penalty=1.5, frequency_penalty=0.1, presence_penalty=0.2), history)
    assert out[old] == LOGITS[old]
    assert out[recent] == pytest.approx(LOGITS[recent] / 1.5 - 0.1 * WINDOW - 0.2)
    edge = adjusted(SamplingParams(presence_penalty=1.0), [old, *[recent] * (WINDOW - 1)])
    assert edge[old] == pytest.approx(LOGITS[old] - 1.0)  # the 64th-last token still counts


def test_bias_and_penalties_compose_in_the_documented_order() -> None:
    """Bias first, then repeat (on the biased logit's sign), then frequency and presence."""
    tok = REPEATS[0]
    params = SamplingParams(
        logit_bias={tok: -LOGITS[tok] - 1.0}, repeat_penalty=2.0, frequency_penalty=0.25, presence_penalty=0.5
    )
    out = adjusted(params, [tok, tok])
    assert out[tok] == pytest.approx(-1.0 * 2.0 - 0.5 - 0.5)  # biased to -1, then multiplied


# --- mutations: each of these bugs fails the chi-square test --------------------------------


def _mutant(
    kind: str, params: SamplingParams
) -> Callable[[np.ndarray, Sequence[int], np.ndarray | None], int]:
    """A deliberately wrong sampler: zinc's pipeline with one step broken."""
    sampler = Sampler(params)
    p = params

    def sample(logits: np.ndarray, history: Sequence[int], allowed: np.ndarray | None) -> int:
        x = sampler.adjust(logits, history).astype(np.float64)
        if allowed is not None:
            x[~allowed] = -np.inf
        t = 1.0 if kind in ("temperature ignored", "temperature last") else p.temperature
        scaled = x / t
        order = np.argsort(-scaled, kind="stable")
        if p.top_k > 0:
            order = order[: p.top_k + (1 if kind == "top_k one too many" else 0)]
        z = scaled[order]
        probs = np.exp(z - z[0])
        probs /= probs.sum()
        keep = probs.size
        if p.min_p > 0:
            keep = min(keep, int(np.count_nonzero(probs >= p.min_p * probs[0])))
        if p.top_p < 1.0:
            at = int(np.searchsorted(np.cumsum(probs), p.top_p))
            keep = min(keep, {"top_p one too few": at, "top_p one too many": at + 2}.get(kind, at + 1))
        probs = probs[: max(keep, 1)]
        if kind == "temperature last":  # llama.cpp's order: truncate untempered, then temper
            probs = probs ** (1.0 / p.temperature)
        return int(order[sampler.rng.choice(probs.size, p=probs / probs.sum())])

    return sample


MUTATIONS = {
    "temperature ignored": ["temperature 0.7", "temperature 1.8"],
    "temperature last": ["top_p 0.6 at 0.7", "min_p 0.2 at 1.5"],
    "top_p one too few": ["top_p 0.8", "top_p 0.6 at 0.7"],
    "top_p one too many": ["top_p 0.8", "top_p 0.6 at 0.7"],
    "top_k one too many": ["top_k 7"],
}


@pytest.mark.parametrize("kind", sorted(MUTATIONS))
def test_the_chi_square_test_catches_mutated_samplers(kind: str) -> None:
    """The test's power, shown: each broken sampler fails the configs it touches, while the
    unbroken mutant (`kind` "none") passes them."""
    by_name = {c[0]: c for c in CONFIGS}
    for name in MUTATIONS[kind]:
        _, params, history, allowed = by_name[name]
        probs = reference_distribution(LOGITS, params, history, allowed)
        assert fits(draws(_mutant("none", params), history, allowed), probs)[0], name
        ok, why = fits(draws(_mutant(kind, params), history, allowed), probs)
        assert not ok, f"{kind} passed {name}: {why}"


# --- the real engine: a seed's tokens do not depend on the rerun or the batch ------------------


@pytest.fixture(scope="module")
def engine(smollm2: Path) -> Iterator[Any]:
    from zinc.compiler.build import ensure_artifact
    from zinc.engine.engine import LocalEngine
    from zinc.model.gguf_file import open_gguf
    from zinc.runtime.device import resolve_device
    from zinc.runtime.session import ModelSession
    from zinc.tokenizer import ChatTemplate, Tokenizer

    context = 256
    session = ModelSession(
        ensure_artifact(smollm2, "cpu"), smollm2, resolve_device("cpu"), context, kv_slots=4 * context + 64
    )
    meta = open_gguf(smollm2).metadata
    tokenizer = Tokenizer.from_metadata(meta)
    eng = LocalEngine(session, tokenizer, ChatTemplate.from_metadata(meta, tokenizer), "smollm2", parallel=4)
    yield eng
    eng.close()


@pytest.mark.slow
@pytest.mark.e2e
def test_a_seed_gives_the_same_tokens_alone_on_a_rerun_and_in_any_batch(engine: Any) -> None:
    """SmolLM2 through the real engine (continuous batching, CPU): a sampled request with a seed
    gives the same tokens alone, again alone, and decoded in one batch with other requests
    (sampled with other seeds, and greedy) that start with it or while it runs."""
    from zinc.engine.types import GenerationRequest

    sampled = SamplingParams(temperature=1.0, top_k=50, top_p=0.95, repeat_penalty=1.1, seed=4242)
    n = 24
    prompt = engine.tokenize("Once upon a time, in a small village by the sea,")
    others = [
        ("The three primary colors are", SamplingParams(temperature=0.9, seed=7), 30),
        ("def add(a, b):", SamplingParams(), 40),
        ("Water boils at", SamplingParams(temperature=1.3, top_p=0.9, seed=99), 12),
    ]
    peak = 0

    async def run(
        rid: str, ids: list[int], params: SamplingParams, max_tokens: int, delay: float = 0.0
    ) -> list[int]:
        await asyncio.sleep(delay)
        request = GenerationRequest(rid, ids, max_tokens, params, stop_on_eog=False)
        return [t async for delta in engine.generate(request) for t in delta.token_ids]

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max(peak, engine.stats().active_requests)
            await asyncio.sleep(0.002)

    async def together(delays: Sequence[float]) -> list[list[int]]:
        watcher = asyncio.create_task(watch())
        jobs = [run("s", prompt, sampled, n, delays[0])]
        jobs += [run(f"o{i}", engine.tokenize(text), p, k, d)
                 for i, ((text, p, k), d) in enumerate(zip(others, delays[1:], strict=True))]  # fmt: skip
        out = await asyncio.gather(*jobs)
        watcher.cancel()
        return list(out)

    alone = asyncio.run(run("a", prompt, sampled, n))
    assert len(alone) == n
    assert asyncio.run(run("b", prompt, sampled, n)) == alone  # a rerun
    assert asyncio.run(run("c", prompt, replace(sampled, seed=4243), n)) != alone  # the seed matters
    assert asyncio.run(run("g", prompt, SamplingParams(), n)) != alone  # it did sample
    assert asyncio.run(together([0.0, 0.0, 0.0, 0.0]))[0] == alone  # all start together
    assert asyncio.run(together([0.3, 0.0, 0.0, 0.0]))[0] == alone  # it joins a running batch
    assert peak >= 3, "the requests were not decoded together"
