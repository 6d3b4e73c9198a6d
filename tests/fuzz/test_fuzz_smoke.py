"""A smoke of the fuzz tier in the default test run: a few dozen cases of its request-bytes and
JSON-body tests against the fake engine's server, with the same checks (tests/fuzz/harness.py)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.harness import ErrorRecords, check_json_case, check_raw_case
from tests.fuzz.strategies import FIELDS, json_body, request_bytes
from tests.server_harness import RunningServer

pytestmark = pytest.mark.e2e
SMOKE = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)


@SMOKE
@given(data=request_bytes())
def test_request_bytes_smoke(fake_srv: RunningServer, errors: ErrorRecords, data: bytes) -> None:
    check_raw_case(fake_srv, errors, data)


@SMOKE
@given(data=st.data(), path=st.sampled_from(sorted(FIELDS)))
def test_json_bodies_smoke(
    fake_srv: RunningServer, errors: ErrorRecords, data: st.DataObject, path: str
) -> None:
    check_json_case(fake_srv, errors, path, data.draw(json_body(path)))
