"""Several `zinc serve` replicas behind HAProxy running deploy/haproxy.cfg, as real processes: what
tests/e2e/test_replicas.py and bench/bench_replicas.py share.

Owns: free ports, starting, signalling and stopping the replicas and the balancer (each process
in its own process group, its output in a log file, all of them killed by `Cluster.close`),
HAProxy's view of its servers (its stats CSV), what becomes of these tests when HAProxy is not
installed (`haproxy_verdict`), and one chat request with what came back of it (`chat`, `Reply`).
Imports: the standard library, httpx2 and orjson; nothing of zinc's (the replicas are processes).
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx2
import orjson

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "deploy" / "haproxy.cfg"
NAMES = ("r1", "r2", "r3")  # the server names in deploy/haproxy.cfg, ZINC_REPLICA_1..3
SessionIn = Literal["both", "header", "body"]  # where a request carries its session id
NO_HAPROXY = "haproxy is not installed (apt-get install haproxy)"
# a small replica: 4 requests decoded together on one thread, so three share 2 cores
REPLICA_ARGS = ("--device", "cpu", "--parallel", "4", "--threads", "1", "-c", "512", "--max-queue", "32")


def haproxy_verdict(haproxy: str | None, environ: Mapping[str, str]) -> tuple[str, str] | None:
    """What becomes of a test that needs HAProxy: None (it runs), ("skip", why) or ("fail", why).
    Without the `haproxy` binary it is skipped, unless ZINC_REQUIRE_HAPROXY=1 (set by .ci/run,
    which installs it), which makes it fail: CI must not pass with these tests quietly skipped."""
    if haproxy:
        return None
    if environ.get("ZINC_REQUIRE_HAPROXY") == "1":
        return "fail", f"{NO_HAPROXY}, and ZINC_REQUIRE_HAPROXY=1 requires it"
    return "skip", NO_HAPROXY


def find_haproxy() -> str | None:
    """The haproxy binary: on PATH, or where Debian puts it (/usr/sbin, often not on a user's PATH)."""
    return shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def _deadline_loop(timeout: float, what: str) -> Iterator[None]:
    """Yields until `timeout` seconds have passed, then fails with `what`."""
    deadline = time.monotonic() + timeout
    while True:
        yield
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


class Process:
    """A child in its own process group (so a signal reaches all of it), its output in `log`."""

    def __init__(self, argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None) -> None:
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                list(argv), cwd=REPO, env=dict(env or os.environ), stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL to the whole group, then reap it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, n: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-n:]


class Replica:
    """One `zinc serve` on a port of its own; `start` again after a kill reuses the port."""

    def __init__(self, name: str, logdir: Path, args: Sequence[str] = REPLICA_ARGS) -> None:
        self.name, self.logdir, self.args = name, logdir, tuple(args)
        self.port = free_port()
        self.process: Process | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def start(self) -> None:
        argv = [sys.executable, "-m", "zinc", "serve", "--host", "127.0.0.1", "--port", str(self.port)]
        self.process = Process([*argv, *self.args], self.logdir / f"{self.name}.log")

    def health(self) -> int | None:
        """The status of GET /health, None when nothing answers."""
        try:
            return httpx2.get(f"{self.url}/health", timeout=5).status_code
        except httpx2.TransportError:
            return None

    def wait_ready(self, timeout: float = 300) -> None:
        """Until /health says 200 (a first start compiles the model into $ZINC_CACHE)."""
        assert self.process is not None
        for _ in _deadline_loop(timeout, f"{self.name} did not become ready"):
            assert self.process.alive(), f"{self.name} exited:\n{self.process.tail()}"
            if self.health() == 200:
                return

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()


class Balancer:
    """HAProxy running deploy/haproxy.cfg over the replicas' addresses."""

    def __init__(self, addresses: Sequence[str], logdir: Path) -> None:
        haproxy = find_haproxy()
        assert haproxy is not None, NO_HAPROXY
        self.port, self.stats_port = free_port(), free_port()
        env = {**os.environ, "ZINC_LB_BIND": f"127.0.0.1:{self.port}"}
        env["ZINC_LB_STATS"] = f"127.0.0.1:{self.stats_port}"
        env.update({f"ZINC_REPLICA_{i + 1}": address for i, address in enumerate(addresses)})
        self.process = Process([haproxy, "-db", "-f", str(CONFIG)], logdir / "haproxy.log", env)
        self.url = f"http://127.0.0.1:{self.port}"

    def states(self) -> dict[str, str]:
        """Each server's status in the health-checked backend ("UP", "DOWN", "UP 1/2", ...)."""
        text = httpx2.get(f"http://127.0.0.1:{self.stats_port}/stats;csv", timeout=5).text
        rows = csv.DictReader(io.StringIO(text.removeprefix("# ")))
        return {row["svname"]: row["status"] for row in rows if row["pxname"] == "zinc_sessions"}

    def wait_states(self, expected: Mapping[str, str], timeout: float = 30) -> float:
        """Until the servers named in `expected` have those statuses; returns the seconds it took."""
        start = time.monotonic()
        seen: dict[str, str] = {}
        for _ in _deadline_loop(timeout, f"servers never reached {dict(expected)}: {seen}"):
            assert self.process.alive(), f"haproxy exited:\n{self.process.tail()}"
            try:
                seen = self.states()
            except httpx2.TransportError:
                continue
            if all(seen.get(name) == status for name, status in expected.items()):
                return time.monotonic() - start
        raise AssertionError("unreachable")

    def stop(self) -> None:
        self.process.kill()


class Cluster:
    """`n` replicas (named r1..rn) behind the balancer; `close` kills every process it started.
    Addresses of servers past `n` (when `n` < 3) point at a port nothing listens on: HAProxy
    marks them DOWN and sends them nothing."""

    def __init__(self, logdir: Path, n: int = 3, args: Sequence[str] = REPLICA_ARGS) -> None:
        self.replicas = [Replica(name, logdir, args) for name in NAMES[:n]]
        self.balancer: Balancer | None = None
        try:
            for replica in self.replicas:
                replica.start()
            for replica in self.replicas:
                replica.wait_ready()
            addresses = [r.address for r in self.replicas] + [f"127.0.0.1:{free_port()}"] * (3 - n)
            self.balancer = Balancer(addresses, logdir)
            up = {r.name: "UP" for r in self.replicas} | {name: "DOWN" for name in NAMES[n:]}
            self.balancer.wait_states(up)
        except BaseException:
            self.close()
            raise

    @property
    def lb(self) -> Balancer:
        assert self.balancer is not None
        return self.balancer

    def replica(self, name: str) -> Replica:
        return next(r for r in self.replicas if r.name == name)

    def close(self) -> None:
        for replica in self.replicas:
            replica.stop()
        if self.balancer is not None:
            self.balancer.stop()


@dataclass
class Reply:
    """What came back of one chat request. `done`: a whole answer (a body that parsed, or a
    stream that reached `data: [DONE]`); `error`: the transport error that ended it instead."""

    status: int = 0
    served_by: str = ""
    text: str = ""
    finish: str | None = None
    usage: dict[str, Any] | None = None
    done: bool = False
    error: str | None = None
    sent_at: float = 0.0
    first_token_at: float | None = None
    ended_at: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


def chat_body(
    messages: list[dict[str, str]], max_tokens: int, stream: bool, session: str | None
) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": messages, "max_tokens": max_tokens, "stream": stream}
    body["temperature"] = 0
    if stream:
        body["stream_options"] = {"include_usage": True}
    if session is not None:
        body["session_id"] = session
    return body


def chat(
    base_url: str,
    messages: list[dict[str, str]],
    *,
    max_tokens: int = 16,
    stream: bool = False,
    session: str | None = None,
    session_in: SessionIn = "both",
    timeout: float = 60,
    started: Any = None,
) -> Reply:
    """POST /v1/chat/completions; with `session`, its id as X-Session-Id and in the body's
    `session_id` ("both"), or in one of them. `started` (a threading.Event) is set at a stream's
    first token. A read that waits longer than `timeout` raises: a hang fails the caller."""
    header = session is not None and session_in != "body"
    headers = {"X-Session-Id": session} if header and session is not None else {}
    body = chat_body(messages, max_tokens, stream, session if session_in != "header" else None)
    reply = Reply(sent_at=time.monotonic())
    with httpx2.Client(timeout=httpx2.Timeout(timeout, connect=5)) as client:
        try:
            with client.stream("POST", f"{base_url}/v1/chat/completions", json=body, headers=headers) as r:
                reply.status, reply.headers = r.status_code, dict(r.headers)
                reply.served_by = r.headers.get("x-served-by", "")
                if not stream or r.status_code != 200:
                    _whole(reply, r.read())
                else:
                    for line in r.iter_lines():
                        _event(reply, line, started)
        except httpx2.TimeoutException:
            raise
        except httpx2.TransportError as exc:
            reply.error = f"{type(exc).__name__}: {exc}"
    reply.ended_at = time.monotonic()
    return reply


def _whole(reply: Reply, data: bytes) -> None:
    if reply.status != 200:  # an error in JSON, or HAProxy's own page (502, 503, 504)
        reply.text = data.decode(errors="replace")
        return
    answer = orjson.loads(data)
    choice = answer["choices"][0]
    reply.text, reply.finish = choice["message"]["content"] or "", choice["finish_reason"]
    reply.usage, reply.done = answer["usage"], True
    reply.first_token_at = time.monotonic()


def _event(reply: Reply, line: str, started: Any) -> None:
    if line == "data: [DONE]":
        reply.done = True
        return
    if not line.startswith("data: {"):
        return
    event = orjson.loads(line[6:])
    if event.get("usage"):
        reply.usage = event["usage"]
    for choice in event.get("choices") or ():
        if content := choice.get("delta", {}).get("content"):
            if reply.first_token_at is None:
                reply.first_token_at = time.monotonic()
                if started is not None:
                    started.set()
            reply.text += content
        reply.finish = choice.get("finish_reason") or reply.finish
