"""Every command's last line is strict JSON: non-finite figures are the strings "inf" / "nan"."""

from __future__ import annotations

import json
import math

import pytest

from solm.cli import main
from solm.jsonline import json_line, strict


def _reject(word: str):
    raise ValueError(f"not JSON: {word}")


def strict_loads(line: str):
    """json.loads that refuses NaN / Infinity / -Infinity, as jq and JSON.parse do."""
    return json.loads(line, parse_constant=_reject)


def test_non_finite_floats_become_strings_at_any_depth():
    value = {"a": math.inf, "b": [1.5, -math.inf, {"c": math.nan}], "d": (2, math.nan), "e": None, "f": "x", "g": 3}
    assert strict(value) == {"a": "inf", "b": [1.5, "-inf", {"c": "nan"}], "d": [2, "nan"], "e": None, "f": "x", "g": 3}
    assert strict_loads(json_line(value))["b"][1] == "-inf"
    with pytest.raises(ValueError, match="not JSON"):
        strict_loads(json.dumps(value))  # what the commands printed before


def test_json_line_still_refuses_what_json_cannot_write():
    with pytest.raises(TypeError):
        json_line({"a": object()})


def test_simulate_all_at_once_prints_strict_json(small_trace, capsys):
    # --rate inf: every request arrives at t = 0; the line printed "rate": Infinity before
    assert main(["simulate", str(small_trace), "--hardware", "h100-sxm", "--rate", "inf", "--json"]) == 0
    figures = strict_loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["rate"] == "inf"
    assert figures["request_throughput"] > 0
