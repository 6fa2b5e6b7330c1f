"""Fixtures of the simulator tests."""

from __future__ import annotations

import pytest

from simulator import comm
from simulator.comm import CommParams, Ramp


@pytest.fixture
def quarter_second_collectives(monkeypatch):
    """Every collective call takes exactly 0.25 s on the made-up part (latency only)."""
    ramp = Ramp(eff_max=1.0, ramp_bytes=1e-30, ramp_exponent=1.0, latency_s=0.25)
    params = CommParams({path: {"ring": ramp, "p2p": ramp} for path in comm.PATHS})
    monkeypatch.setattr(comm, "load_params", lambda: params)
