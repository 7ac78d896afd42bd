"""The chart's Grafana dashboard (charts/trainingrun/dashboards/) as the tests read it: its PromQL expressions and the
metric names each one reads.

    for title, expr in expressions(): ...        every panel target's expression (and the variables' queries)
    metric_names('sum by (le) (rate(x_bucket{a="b"}[5m]))') == {"x_bucket"}
"""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "charts" / "trainingrun" / "dashboards" / "trainingrun.json"

# What may stand in an expression beside metric names: the functions, aggregations and keywords the dashboard uses.
PROMQL_WORDS = frozenset(
    {
        "sum",
        "max",
        "min",
        "avg",
        "count",
        "rate",
        "increase",
        "histogram_quantile",
        "label_values",
        "and",
        "or",
        "unless",
        "bool",
        "offset",
    }
)


def load() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def panels(dashboard: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every panel but the rows, nested ones included."""
    found = []
    for panel in (dashboard or load())["panels"]:
        found += [panel] if panel["type"] != "row" else []
        found += panel.get("panels", []) if panel["type"] == "row" else []
    return found


def expressions(dashboard: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """(panel title, expression) of every target, then ("variable <name>", query) of every query variable."""
    dashboard = dashboard or load()
    found = [(p["title"], t["expr"]) for p in panels(dashboard) for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            found.append((f"variable {variable['name']}", query["query"] if isinstance(query, dict) else query))
    return found


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads (strings, label matchers, ranges and grouping clauses taken out)."""
    expr = re.sub(r'"[^"]*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*,[^)]*\)", r"\1", expr)
    return {t for t in re.findall(r"(?<![\w$])[A-Za-z_:][A-Za-z0-9_:]*", expr) if t not in PROMQL_WORDS}


def instantiate(expr: str, namespace: str, interval: str = "1m") -> str:
    """The expression as Grafana would send it for one namespace."""
    return expr.replace("$namespace", namespace).replace("$__rate_interval", interval)
