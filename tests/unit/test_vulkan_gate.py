"""Without a Vulkan device the `vulkan` tests are skipped, but fail under ZINC_REQUIRE_VULKAN=1 (CI)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest

from tests import conftest
from tests.conftest import vulkan_verdict


def test_a_missing_device_skips_unless_required() -> None:
    assert vulkan_verdict(("llvmpipe (LLVM 15.0.6, 256 bits)",), {"ZINC_REQUIRE_VULKAN": "1"}) is None
    assert vulkan_verdict(("llvmpipe (LLVM 15.0.6, 256 bits)",), {}) is None
    for environ in ({}, {"ZINC_REQUIRE_VULKAN": "0"}, {"ZINC_REQUIRE_VULKAN": ""}):
        verdict = vulkan_verdict((), environ)
        assert verdict is not None and verdict[0] == "skip" and "no Vulkan device" in verdict[1]
    assert vulkan_verdict((), {"ZINC_REQUIRE_VULKAN": "1"}) == (
        "fail",
        f"{conftest.NO_VULKAN}, and ZINC_REQUIRE_VULKAN=1 requires one",
    )


def test_the_setup_hook_fails_a_vulkan_test_when_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conftest, "vulkan_devices", lambda: ())  # no driver, or a broken one
    vulkan_test = cast(pytest.Item, SimpleNamespace(keywords={"vulkan": True}))
    other_test = cast(pytest.Item, SimpleNamespace(keywords={}))
    monkeypatch.setenv("ZINC_REQUIRE_VULKAN", "1")
    with pytest.raises(pytest.fail.Exception, match="ZINC_REQUIRE_VULKAN=1 requires one"):
        conftest.pytest_runtest_setup(vulkan_test)
    conftest.pytest_runtest_setup(other_test)  # untouched
    monkeypatch.delenv("ZINC_REQUIRE_VULKAN")
    with pytest.raises(pytest.skip.Exception, match="no Vulkan device"):
        conftest.pytest_runtest_setup(vulkan_test)
