"""GPU tests: a watchdog per test.

Two of three H100 runs of `pytest -m gpu` (results/bench/NOTES.md, runs 6-7) stalled inside a
cuSPARSELt call with fp16 operands, in different tests, without pytest-timeout's thread dump: the
stalled call held the GIL. faulthandler's watchdog is a C thread that needs no GIL, so a stalled
test prints every thread's Python stack and ends the process instead of hanging the run until an
outer time limit kills it without a trace.
"""

import faulthandler
import os
import sys

import pytest

WATCHDOG_S = float(os.environ.get("SPARSITY_GPU_TEST_WATCHDOG_S", "150"))


@pytest.fixture(autouse=True)
def _stall_watchdog(request):
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True, file=sys.__stderr__)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
