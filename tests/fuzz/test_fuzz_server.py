"""The fuzz tier (`pytest --fuzz -m fuzz`, `just test-fuzz`): hostile request bytes and JSON bodies
against a running server, minutes long. Every case must end without a 500, without an error
logged by the server (a handler that raised), without a client left hanging, and with the server
answering `/health` afterwards (tests/fuzz/harness.py).

Request bytes and the bodies of all four generation endpoints go to a server on the fake engine
(fast, so thousands of cases run); bodies also go to the real SmolLM2, whose GGUF tokenizer and
Jinja chat template see them (fewer cases, token limits capped). `ZINC_FUZZ_EXAMPLES` sets the
number of cases per test (default 2,000; a tenth of it for the real model). A few dozen cases of
each fake-engine test run in the default tier (test_fuzz_smoke.py).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.harness import ErrorRecords, check_json_case, check_raw_case
from tests.fuzz.strategies import FIELDS, json_body, request_bytes
from tests.server_harness import RunningServer

pytestmark = [pytest.mark.fuzz, pytest.mark.e2e]
EXAMPLES = int(os.environ.get("ZINC_FUZZ_EXAMPLES", "2000"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
REAL = settings(FUZZ, max_examples=max(1, EXAMPLES // 10))
PATHS = sorted(FIELDS)


@FUZZ
@given(data=request_bytes())
def test_fuzz_request_bytes(fake_srv: RunningServer, errors: ErrorRecords, data: bytes) -> None:
    check_raw_case(fake_srv, errors, data)


@FUZZ
@given(data=st.data(), path=st.sampled_from(PATHS))
def test_fuzz_json_bodies(
    fake_srv: RunningServer, errors: ErrorRecords, data: st.DataObject, path: str
) -> None:
    check_json_case(fake_srv, errors, path, data.draw(json_body(path)))


@pytest.mark.slow
@REAL
@given(data=st.data(), path=st.sampled_from(PATHS))
def test_fuzz_json_bodies_real_model(
    real_srv: RunningServer, errors: ErrorRecords, data: st.DataObject, path: str
) -> None:
    check_json_case(real_srv, errors, path, data.draw(json_body(path, max_tokens_cap=4)))
