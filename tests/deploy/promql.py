"""Metric names and label matchers in a PromQL expression. Good enough for the queries in deploy/: string
literals, label matchers, ranges, durations, grouping clauses and function names are removed, and what is left
are series names. Syntax itself is checked by promtool (tests/deploy/test_prometheus.py)."""

from __future__ import annotations

import re

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or",
            "unless", "inf", "nan", "atan2"}
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_SELECTOR = re.compile(r"(?<![\w:.$])([a-zA-Z_:][\w:]*)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*\"(?:[^\"\\]|\\.)*\"")


def grafana_to_promql(expr: str) -> str:
    """Grafana's template variables -> values PromQL parses."""
    expr = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m").replace("$__range", "1h")
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(series name, label names in its matcher) for every `name{...}`."""
    return [(m.group(1), {x.group(1) for x in _MATCHER.finditer(m.group(2))}) for m in _SELECTOR.finditer(expr)]


def metric_names(expr: str) -> set[str]:
    e = re.sub(r"\{([^}]*)\}", " ", expr)           # label matchers (and the strings in them)
    e = re.sub(r"\"(?:[^\"\\]|\\.)*\"", " ", e)       # other string literals
    e = re.sub(r"\[[^\]]*\]", " ", e)                 # range and subquery brackets
    e = re.sub(r"\boffset\s+\w+", " ", e)             # offset 1h
    e = _GROUPING.sub(" ", e)                          # by (...), on (...), ...
    e = re.sub(r"\b[a-zA-Z_]\w*\s*\(", "(", e)        # function and aggregation names
    idents = re.findall(r"(?<![\w.])([a-zA-Z_:][\w:]*)", e)
    return {i for i in idents if i.lower() not in KEYWORDS and not re.fullmatch(r"\d+[smhdwy]", i)}
