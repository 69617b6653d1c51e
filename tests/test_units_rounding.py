"""One rounding rule for every number shown: half away from zero on the exact value (what the
HTML pages' ``toFixed`` does), and nothing that rounds to zero carries a sign."""

from __future__ import annotations

import json
import re

import pytest

from memscope.reporters.html import render_runtime_html
from memscope.units import (
    ALARM_RATIO,
    NUMBER_RULES,
    format_bytes,
    format_duration,
    format_percent,
    format_ratio,
)


def test_ties_round_half_away_from_zero_like_javascripts_to_fixed():
    assert format_bytes(1152) == "1.13 KiB"  # 1.125 KiB: half-even would give 1.12
    assert format_bytes(-1152, signed=True) == "-1.13 KiB"
    assert format_ratio(0.00125) == "+0.1%"  # 0.125% exactly
    assert format_percent(0.5) == "50.0%"


def test_a_value_that_rounds_to_zero_has_no_sign():
    assert format_ratio(-0.0001) == "0.0%" and format_ratio(0.0004) == "0.0%"
    assert format_ratio(-0.0005) == "-0.1%" and format_ratio(0.031) == "+3.1%"
    assert format_bytes(-0.4, signed=True) == "0 B" and format_bytes(0, signed=True) == "0 B"


def test_the_page_script_gets_the_same_rules(demo_rank0):
    from memscope.reporters.html_payload import runtime_payload

    report, _ = demo_rank0
    html = render_runtime_html(runtime_payload(report))
    rules = re.search(r"const RULES = (\{[^}]*\});", html)
    assert rules and json.loads(rules.group(1)) == NUMBER_RULES
    assert NUMBER_RULES["alarm_ratio"] == ALARM_RATIO


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.000412, "412 µs"), (0.0345, "34.5 ms"), (2.5, "2.50 s"), (125, "2 min 5 s"),
     (None, "n/a"), (-1, "invalid"), (float("nan"), "invalid")],
)  # fmt: skip
def test_durations_are_printed_in_the_unit_that_reads_best(seconds, text):
    assert format_duration(seconds) == text
