"""The built-in chat UI in a real headless Chromium (Debian's `chromium`, driven by Playwright; no
browser is downloaded): load the page, pick the model, send a message and watch tokens arrive,
stop a generation (the server aborts it), keep the conversation, and take a screenshot.

Needs `apt-get install chromium` (the CI script installs it). Without it this test fails with a
clear message; it is skipped only when ZINC_SKIP_BROWSER=1 is set (never in CI).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.fakes import FakeEngine, expected_text
from tests.serving import FakeLoader, ServerThread
from zinc.catalog.entries import CatalogEntry
from zinc.catalog.registry import CatalogRegistry
from zinc.engine.manager import EngineManager

pytestmark = pytest.mark.e2e
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def chromium_path() -> str:
    if os.environ.get("ZINC_SKIP_BROWSER") == "1":
        pytest.skip("ZINC_SKIP_BROWSER=1")
    configured = os.environ.get("ZINC_CHROMIUM")
    found = configured or next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)
    if not found:
        pytest.fail(
            "no Chromium found for the browser test: apt-get install chromium (or set ZINC_SKIP_BROWSER=1)"
        )
    return found


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ServerThread, EngineManager]]:
    """The fake model served, and "other-model" installed in a catalog (a file in the store)."""
    other = CatalogEntry(
        id="other-model", display_name="Other Model", source="https://example.invalid/other.gguf",
        sha256="0" * 64, size_bytes=3, architecture="llama", quantization="Q8_0",
    )  # fmt: skip
    (tmp_path / "catalog.json").write_bytes(orjson.dumps({"models": [other.to_json()]}))
    registry = CatalogRegistry(tmp_path, supported={"llama"}, memory_budget_bytes=1 << 34)
    registry.store.gguf_path("other-model").parent.mkdir(parents=True)
    registry.store.gguf_path("other-model").write_bytes(b"GGUF")
    loader = FakeLoader({"fake-model"}, registry, token_delay=0.03)
    manager = EngineManager(FakeEngine(token_delay=0.03), loader=loader, registry=registry)
    srv = ServerThread(manager)
    yield srv, manager
    srv.stop()


def test_chat_ui_streams_stops_and_keeps_the_conversation(
    served: tuple[ServerThread, FakeEngine], tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    srv, manager = served
    engine = manager.active
    assert isinstance(engine, FakeEngine)
    executable = chromium_path()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox", "--disable-gpu"])
        try:
            # the page's CSP forbids eval, which wait_for_function needs; the CSP itself is tested elsewhere
            page = browser.new_page(viewport={"width": 1000, "height": 700}, bypass_csp=True)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(srv.url + "/")
            page.wait_for_function("document.querySelector('#model').options.length > 0")
            assert page.locator("#model").input_value() == "fake-model"
            assert page.locator("#status").inner_text() == "ready"

            # send a message and watch the answer grow token by token
            page.fill("#max-tokens", "20")
            page.fill("#prompt", "Say hello")
            page.click("#send")
            reply = page.locator(".msg.assistant").last
            lengths: list[int] = []
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                lengths.append(len(reply.locator(".content").inner_text()))
                if "done" in (reply.get_attribute("class") or ""):
                    break
                time.sleep(0.02)
            assert reply.locator(".content").inner_text() == expected_text(20)
            growing = sorted(set(lengths) - {0, len(expected_text(20))})
            assert len(growing) >= 3, f"tokens did not arrive one by one: {lengths}"
            assert engine.requests[-1].max_tokens == 20

            # a long answer, stopped half way: the server aborts the generation
            page.fill("#max-tokens", "400")
            page.fill("#prompt", "Tell me a long story")
            page.press("#prompt", "Enter")
            page.wait_for_function(
                "document.querySelectorAll('.msg.assistant')[1].querySelector('.content').textContent.length > 20"
            )
            assert page.locator("#stop").is_visible() and not page.locator("#send").is_visible()
            page.click("#stop")
            stopped = page.locator(".msg.assistant").nth(1)
            page.wait_for_function(
                "document.querySelectorAll('.msg.assistant')[1].classList.contains('done')"
            )
            assert stopped.locator(".note").inner_text() == "stopped"
            deadline = time.monotonic() + 5
            while len(engine.aborts) < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert len(engine.aborts) == 1 and len(engine.completed) == 1

            # the picker switches models; the conversation so far goes with the next request
            options = page.locator("#model option").all_inner_texts()
            assert options[0] == "fake-model (loaded)" and "Other Model" in options, options
            assert not any("Gemma" in o for o in options)  # not runnable here: not offered
            page.select_option("#model", "other-model")
            page.fill("#max-tokens", "3")
            page.fill("#prompt", "And now?")
            page.click("#send")
            page.wait_for_function(
                "document.querySelectorAll('.msg.assistant')[2]?.classList.contains('done')"
            )
            assert page.locator(".msg.user").count() == 3 and page.locator(".msg.assistant").count() == 3
            other = manager.active
            assert isinstance(other, FakeEngine) and other.model_id == "other-model"
            roles = [m["role"] for m in other.template_calls[-1][0]]
            assert roles == ["user", "assistant", "user", "assistant", "user"]
            page.wait_for_function(
                "document.querySelector('#model option:checked').textContent.includes('(loaded)')"
            )
            assert page.locator("#model").input_value() == "other-model"
            page.screenshot(path=str(tmp_path / "chat.png"), full_page=True)
            assert (tmp_path / "chat.png").stat().st_size > 10_000
            page.reload()  # the conversation is kept across a reload of the page
            page.wait_for_function("document.querySelectorAll('.msg').length == 6")
            assert not errors, errors
        finally:
            browser.close()
