"""The monitoring files ``trtspec build`` puts beside the repository: alert rules and dashboard."""

from __future__ import annotations

import json
from pathlib import Path

from trtspec.obs.dashboard import dashboard
from trtspec.obs.rules import AlertConfig, render_rules

RULES_FILE = "rules.yml"
DASHBOARD_FILE = "dashboard.json"


def write_monitoring(directory: str | Path, cfg: AlertConfig = AlertConfig()) -> dict[str, Path]:
    """Write ``rules.yml`` and ``dashboard.json`` into ``directory``; their paths."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    rules, dash = d / RULES_FILE, d / DASHBOARD_FILE
    rules.write_text(render_rules(cfg))
    dash.write_text(json.dumps(dashboard(cfg), indent=2) + "\n")
    return {"rules": rules, "dashboard": dash}
