"""Three real `zinc serve` replicas (SmolLM2) behind HAProxy running deploy/haproxy.cfg, the file
operators deploy: session affinity under 32 concurrent clients, a replica killed under running
streams, and a rolling restart through SIGTERM and `--drain-delay`.

The replicas are small (`--parallel 4`, one thread each) so three fit on two shared cores. Without
HAProxy the tests that need it are skipped with the reason, and fail under ZINC_REQUIRE_HAPROXY=1
(set by .ci/run, which installs it), as the Vulkan tests do without a driver.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2
import pytest

from tests.replicas import (
    CONFIG,
    NAMES,
    NO_HAPROXY,
    REPLICA_ARGS,
    Balancer,
    Cluster,
    Reply,
    SessionIn,
    chat,
    find_haproxy,
    free_port,
    haproxy_verdict,
)

pytestmark = pytest.mark.e2e
DRAIN_S = 4.0  # --drain-delay: longer than HAProxy takes to see a 503 (2 checks, 1 s + 0.5 s apart)
ARGS = (*REPLICA_ARGS, "--drain-delay", str(DRAIN_S), "--shutdown-timeout", "60")
PAGE = 16  # KV page size: the prefix cache reuses whole pages
SESSION_IN: tuple[SessionIn, ...] = ("both", "body", "header")  # "body": HAProxy reads the body
TOPICS = ("a hiking trip", "a sourdough starter", "a first marathon", "a balcony garden")


def require_haproxy() -> str:
    haproxy = find_haproxy()
    verdict = haproxy_verdict(haproxy, os.environ)
    if verdict is not None:
        kind, why = verdict
        if kind == "fail":
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    assert haproxy is not None
    return haproxy


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    require_haproxy()
    running = Cluster(tmp_path_factory.mktemp("replicas"), 3, ARGS)
    try:
        yield running
    finally:
        running.close()


def question(i: int) -> list[dict[str, str]]:
    """A first turn of about 85 tokens of its own (the number comes first), so a replica that
    holds it caches 5 pages of it, and one that does not at most the shared system prompt's."""
    text = (
        f"Conversation {i}: I am planning {TOPICS[i % len(TOPICS)]} next spring with two friends who "
        "have never done it before. We want something with lakes, a hut to sleep in, and no "
        "difficult crossings. What should we pack, and how should we train?"
    )
    return [{"role": "user", "content": text}]


def session_on(cluster: Cluster, name: str) -> str:
    """A session id that deploy/haproxy.cfg's consistent hash sends to replica `name`."""
    for k in range(200):
        session = f"probe-{k}"
        reply = chat(cluster.lb.url, [{"role": "user", "content": "hi"}], max_tokens=1, session=session)
        assert reply.status == 200, reply
        if reply.served_by == name:
            return session
    raise AssertionError(f"no session id of 200 hashes to {name}")


def draining_within(url: str, seconds: float) -> bool:
    """Whether the replica's /health says 503 "draining" within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        response = httpx2.get(f"{url}/health", timeout=5)
        if response.status_code == 503:
            return bool(response.json()["status"] == "draining")
        time.sleep(0.02)
    return False


def assert_whole(reply: Reply) -> None:
    assert reply.status == 200 and reply.error is None and reply.done, reply
    assert reply.finish in ("length", "stop") and reply.served_by in NAMES, reply
    assert reply.headers.get("x-request-id", "").startswith("req_"), reply.headers


def test_the_haproxy_gate_skips_locally_and_fails_under_ci() -> None:
    assert haproxy_verdict("/usr/sbin/haproxy", {"ZINC_REQUIRE_HAPROXY": "1"}) is None
    assert haproxy_verdict(None, {}) == ("skip", NO_HAPROXY)
    assert haproxy_verdict(None, {"ZINC_REQUIRE_HAPROXY": "0"}) == ("skip", NO_HAPROXY)
    verdict = haproxy_verdict(None, {"ZINC_REQUIRE_HAPROXY": "1"})
    assert verdict is not None and verdict[0] == "fail" and "ZINC_REQUIRE_HAPROXY=1" in verdict[1]


def test_the_config_is_valid_with_the_replica_addresses_and_refused_without() -> None:
    haproxy = require_haproxy()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZINC_REPLICA_")}
    check = [haproxy, "-c", "-f", str(CONFIG)]
    without = subprocess.run(check, env=env, capture_output=True, text=True, timeout=30)
    assert without.returncode != 0 and "'server' expects <name> and <addr>" in without.stderr
    env |= {f"ZINC_REPLICA_{i}": f"10.0.0.{i}:8080" for i in (1, 2, 3)}
    valid = subprocess.run(check, env=env, capture_output=True, text=True, timeout=30)
    assert valid.returncode == 0, valid.stderr
    assert "Configuration file is valid" in valid.stdout
    assert "WARNING" not in valid.stdout + valid.stderr, valid.stderr


def test_with_no_replica_up_a_client_gets_503_in_openais_envelope(tmp_path: Path) -> None:
    require_haproxy()
    balancer = Balancer([f"127.0.0.1:{free_port()}"] * 3, tmp_path)  # nothing listens there
    try:
        balancer.wait_states({name: "DOWN" for name in NAMES})
        body = {"messages": [{"role": "user", "content": "hi"}]}
        response = httpx2.post(f"{balancer.url}/v1/chat/completions", json=body, timeout=10)
    finally:
        balancer.stop()
    assert (response.status_code, response.headers["retry-after"]) == (503, "1")
    assert response.json()["error"] == {
        "message": "no replica is available", "type": "server_error", "param": None, "code": "no_replica",
    }  # fmt: skip


def test_32_clients_all_succeed_and_each_session_stays_on_one_replica(cluster: Cluster) -> None:
    """16 conversations of two turns (their id as header and body, in the body only, which HAProxy
    reads, or as the header only, which zinc reads) and 16 single requests, half of each streamed."""
    url = cluster.lb.url

    def conversation(i: int) -> tuple[Reply, Reply]:
        sid, where, streamed = f"conv-{i}", SESSION_IN[i % 3], i % 2 == 0
        first = chat(url, question(i), max_tokens=16, stream=streamed, session=sid, session_in=where)
        assert_whole(first)
        then = [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And then?"}]
        second = chat(url, question(i) + then, max_tokens=16, stream=streamed, session=sid, session_in=where)
        return first, second

    def single(i: int) -> Reply:
        return chat(url, question(100 + i), max_tokens=16, stream=i % 2 == 0)

    with ThreadPoolExecutor(32) as pool:
        talks = [pool.submit(conversation, i) for i in range(16)]
        singles = [pool.submit(single, i) for i in range(16)]
        conversations = [f.result(timeout=120) for f in talks]
        replies = [f.result(timeout=120) for f in singles]

    for reply in replies:
        assert_whole(reply)
    assert len({r.served_by for r in replies}) >= 2  # leastconn spreads them
    for i, (first, second) in enumerate(conversations):
        assert_whole(second)
        assert second.served_by == first.served_by, (i, first.served_by, second.served_by)
        assert first.usage is not None and second.usage is not None
        whole_pages = first.usage["prompt_tokens"] // PAGE * PAGE
        assert whole_pages >= 5 * PAGE  # more than a replica without the first turn could have
        assert second.usage["prompt_tokens_details"]["cached_tokens"] >= whole_pages, (i, second.usage)
    assert len({first.served_by for first, _ in conversations}) >= 2  # the hash spreads them
    for i, (first, _) in enumerate(conversations):  # hashed on the id in the path: found where it is
        deleted = httpx2.delete(f"{url}/v1/sessions/conv-{i}", timeout=30)
        assert (deleted.status_code, deleted.headers["x-served-by"]) == (200, first.served_by), i
        assert deleted.json() == {"id": f"conv-{i}", "object": "session", "deleted": True}


def test_a_killed_replica_cuts_only_its_own_streams_and_leaves_the_rotation(cluster: Cluster) -> None:
    url, victim = cluster.lb.url, "r2"
    victim_session = session_on(cluster, victim)
    started = [threading.Event() for _ in range(9)]

    def stream(i: int) -> Reply:
        return chat(url, question(200 + i), max_tokens=200, stream=True, started=started[i], timeout=30)

    with ThreadPoolExecutor(10) as pool:
        streams = [pool.submit(stream, i) for i in range(9)]  # leastconn: 3 on each replica
        # a whole (unstreamed) answer under way on the victim: it has sent nothing when the
        # replica dies, so HAProxy retries it elsewhere (retry-on empty-response)
        whole = pool.submit(chat, url, question(300), max_tokens=200, session=victim_session, timeout=60)
        for event in started:
            assert event.wait(60), "a stream never started"
        assert not whole.done()
        killed_at = time.monotonic()
        cluster.replica(victim).stop()  # SIGKILL
        results = [f.result(timeout=60) for f in streams]
        retried = whole.result(timeout=90)

    cut = [r for r in results if r.served_by == victim]
    assert 1 <= len(cut) < len(results), [r.served_by for r in results]
    for reply in cut:  # ended promptly by an error, never a whole answer
        assert reply.error is not None and not reply.done, reply
        assert reply.ended_at - killed_at < 5, reply.ended_at - killed_at
    for reply in results:
        if reply.served_by != victim:
            assert_whole(reply)
    assert_whole(retried)
    assert retried.served_by != victim

    assert cluster.lb.wait_states({victim: "DOWN"}, timeout=5) < 5
    with ThreadPoolExecutor(12) as pool:
        after = list(pool.map(lambda i: chat(url, question(400 + i), session=f"after-{i}"), range(6)))
        after += list(pool.map(lambda i: chat(url, question(500 + i), stream=True), range(6)))
        after.append(chat(url, question(600), session=victim_session))  # hashed to the victim
    for reply in after:
        assert_whole(reply)
        assert reply.served_by != victim

    cluster.replica(victim).start()  # back on its port: HAProxy takes it in after 2 good checks
    cluster.replica(victim).wait_ready()
    cluster.lb.wait_states({victim: "UP"}, timeout=10)
    back = chat(url, question(601), session=victim_session)  # the consistent hash sends it home
    assert_whole(back)
    assert back.served_by == victim


def test_a_draining_replica_leaves_the_rotation_without_failing_a_request(cluster: Cluster) -> None:
    """SIGTERM with --drain-delay: /health says 503 "draining" while requests are still served,
    HAProxy stops sending new ones there within the delay, the stream running there finishes, and
    no request of clients sending all along fails; then the replica restarts and comes back."""
    url, name = cluster.lb.url, "r1"
    replica = cluster.replica(name)
    assert replica.process is not None
    session = session_on(cluster, name)
    stop = threading.Event()
    sent: list[Reply] = []

    def client(i: int) -> None:
        k = 0
        while not stop.is_set():
            k += 1
            messages = [{"role": "user", "content": f"Client {i}, message {k}: say something."}]
            mine = session if i == 0 else None  # client 0 talks to the replica that will drain
            sent.append(chat(url, messages, max_tokens=6, stream=k % 2 == 0, session=mine))

    started = threading.Event()
    with ThreadPoolExecutor(6) as pool:
        # 400 tokens: greedy SmolLM2 answers this question at length, never ending sooner
        running = pool.submit(
            chat, url, question(700), max_tokens=400, stream=True, session=session, started=started
        )
        assert started.wait(60)
        clients = [pool.submit(client, i) for i in range(4)]
        time.sleep(0.5)  # the clients are under way, some on the replica that is about to drain
        assert not running.done()
        termed_at = time.monotonic()
        replica.process.signal(signal.SIGTERM)
        assert draining_within(replica.url, 1.0)  # the signal is handled in its own time
        # a request straight to the draining replica is still served
        direct = pool.submit(chat, replica.url, question(702), max_tokens=8)
        cluster.lb.wait_states({name: "DOWN"}, timeout=DRAIN_S)
        down_at = time.monotonic()
        assert replica.process.alive()  # still draining: HAProxy saw it leave before it closed
        assert replica.process.proc.wait(timeout=60) == 0, replica.process.tail()
        time.sleep(0.5)
        stop.set()
        for future in clients:
            future.result(timeout=60)
        stream, during = running.result(timeout=60), direct.result(timeout=60)

    assert down_at - termed_at < DRAIN_S
    assert (during.status, during.done, during.error) == (200, True, None), during
    assert_whole(stream)  # the stream under way when the signal came finished whole
    assert stream.served_by == name and stream.ended_at > termed_at
    assert len(sent) >= 8
    for reply in sent:
        assert_whole(reply)  # no request failed, whichever replica it reached
        if reply.sent_at > down_at:
            assert reply.served_by != name, reply

    replica.start()
    replica.wait_ready()
    cluster.lb.wait_states({name: "UP"}, timeout=10)
    back = chat(url, question(701), session=session)
    assert_whole(back)
    assert back.served_by == name
