"""``staleness-sim report DIR``: a self-contained report of a sweep's output.

Writes ``DIR/report/report.md`` (PNG figures beside it) and ``report.html`` (the same, with
the figures embedded, so the one file can be mailed around). Figures the sweep cannot draw
are listed with the reason instead.
"""

from __future__ import annotations

import argparse
import base64
import html
import json
from pathlib import Path

import pandas as pd

from staleness_sim.sweeps.store import atomic_write

MAX_TABLE_ROWS = 200
METRICS = {  # column -> (heading, scale, format)
    "updates_per_hour": ("updates/h", 1.0, "{:.3f}"),
    "results_per_hour": ("results/h", 1.0, "{:.1f}"),
    "worker_idle_fraction": ("idle %", 100.0, "{:.1f}"),
    "stale_fraction": ("stale %", 100.0, "{:.1f}"),
    "mean_lag": ("mean lag", 1.0, "{:.3f}"),
    "max_lag": ("max lag", 1.0, "{:.0f}"),
    "data_utilization": ("util %", 100.0, "{:.1f}"),
    "wall_clock_s": ("hours", 1 / 3600, "{:.1f}"),
    # the queue pipeline (absent from cohort-engine sweeps)
    "rho": ("rho", 1.0, "{:.3f}"),
    "mean_staleness": ("staleness", 1.0, "{:.3f}"),
    "closed_form_staleness": ("closed form", 1.0, "{:.3f}"),
    "trainer_idle_fraction": ("trainer idle %", 100.0, "{:.1f}"),
    "rollout_idle_fraction": ("rollout idle %", 100.0, "{:.1f}"),
    # the success model (scenarios with a learning: block)
    "success_final": ("success %", 100.0, "{:.1f}"),
    "hours_to_success": ("h to target", 1.0, "{:.1f}"),
}
SPREAD = {"success_final": ("success sd", 100.0, "{:.1f}")}  # over seeds, where seeds > 1


def point_table(results: pd.DataFrame, axes: tuple[str, ...]) -> pd.DataFrame:
    """One row per point: its axis values, policy, and each metric's mean over seeds."""
    results = results.copy()
    keys = ["point", *axes, "policy_label"]
    mappings = [k for k in keys if results[k].astype(str).str.startswith("{").any()]
    for k in mappings:  # a whole mapping per value (job.engine.roofline): what differs
        if k != "policy":  # the policy is named by the policy label column
            results[k] = mapping_labels(results[k])
    keys = [k for k in keys if k != "policy"]
    cols = [c for c in METRICS if c in results.columns]
    spread = [c for c in SPREAD if c in cols and results["seed"].nunique() > 1]
    table = results.groupby(keys, as_index=False, sort=True).agg(
        seeds=("seed", "nunique"),
        **{c: (c, "mean") for c in cols},
        **{f"{c}_sd": (c, "std") for c in spread},
    )
    for c in cols:
        heading, scale, fmt = METRICS[c]
        table[heading] = (table.pop(c) * scale).map(fmt.format)
        if c == "hours_to_success":  # the mean over the seeds that reach it; none: never
            table[heading] = table[heading].replace("nan", "never")
        if c in spread:
            heading, scale, fmt = SPREAD[c]
            table[heading] = (table.pop(f"{c}_sd") * scale).map(fmt.format)
    return table.drop(columns="point").rename(columns={"policy_label": "policy"})


def mapping_labels(values: pd.Series) -> pd.Series:
    """Mapping-valued axis values (JSON) labelled by the fields that differ among them,
    e.g. ``bandwidth=3.35e+12``."""
    parsed = {v: json.loads(v) for v in values.unique()}
    fields = sorted({f for m in parsed.values() for f in m})
    differ = [f for f in fields if len({json.dumps(m.get(f)) for m in parsed.values()}) > 1]
    show = lambda x: f"{x:g}" if isinstance(x, float) else str(x)  # noqa: E731
    label = {v: ", ".join(f"{f}={show(m.get(f))}" for f in differ) or v for v, m in parsed.items()}
    return values.map(label)


def markdown_table(table: pd.DataFrame) -> str:
    head = "| " + " | ".join(map(str, table.columns)) + " |"
    rule = "|" + "|".join("---" for _ in table.columns) + "|"
    rows = ["| " + " | ".join(str(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join([head, rule, *rows])


def write_report(
    folder: str | Path, out: str | Path | None = None, formats: tuple[str, ...] = ("md", "html")
) -> list[Path]:
    """Write the report files for sweep folder ``folder``; returns the paths written."""
    from staleness_sim.sweeps.plots import load, write_all  # lazy: seaborn is slow to import

    folder = Path(folder)
    data = load(folder)
    out = Path(out) if out is not None else folder / "report"
    notes = write_all(data, out)
    res = data.results
    table = point_table(res, data.axes)
    shown = table.head(MAX_TABLE_ROWS)
    more = (
        f"\n\n({len(table) - len(shown)} more points in results.parquet)"
        if len(table) > len(shown)
        else ""
    )
    name = data.name
    axes_text = ", ".join(f"`{a}` ({res[a].nunique()} values)" for a in data.axes) or "none"
    intro = (
        f"{len(res)} runs: {res['point'].nunique()} points x {res['seed'].nunique()} seeds. "
        f"Axes: {axes_text}. Source: `{folder}`."
    )
    written = []
    if "md" in formats:
        parts = [f"# Sweep report: {name}", "", intro, "", "## Figures", ""]
        for n in notes:
            parts += [f"### {n.title}", ""]
            parts += [f"![{n.title}]({n.path.name})" if n.path else f"*{n.note}*", ""]
        parts += ["## Points (means over seeds)", "", markdown_table(shown) + more, ""]
        path = out / "report.md"
        atomic_write(path, lambda p: p.write_text("\n".join(parts)))
        written.append(path)
    if "html" in formats:
        body = [
            f"<h1>Sweep report: {html.escape(name)}</h1>",
            f"<p>{html.escape(intro)}</p>",
            "<h2>Figures</h2>",
        ]
        for n in notes:
            body.append(f"<h3>{html.escape(n.title)}</h3>")
            if n.path:
                b64 = base64.b64encode(n.path.read_bytes()).decode()
                body.append(f'<img alt="{html.escape(n.title)}" src="data:image/png;base64,{b64}">')
            else:
                body.append(f"<p><em>{html.escape(n.note)}</em></p>")
        body += [
            "<h2>Points (means over seeds)</h2>",
            shown.to_html(index=False),
            html.escape(more),
        ]
        page = (
            "<!doctype html><html><head><meta charset='utf-8'><title>"
            + html.escape(name)
            + "</title><style>body{font-family:sans-serif;max-width:1400px;margin:auto}"
            "img{max-width:100%}table{border-collapse:collapse;font-size:12px}"
            "td,th{border:1px solid #ccc;padding:2px 6px}</style></head><body>"
            + "\n".join(body)
            + "</body></html>"
        )
        path = out / "report.html"
        atomic_write(path, lambda p: p.write_text(page))
        written.append(path)
    return written + [n.path for n in notes if n.path]


def report_command(args: argparse.Namespace) -> int:
    formats = ("md", "html") if args.format == "both" else (args.format,)
    paths = write_report(args.folder, args.out, formats)
    print(f"report written: {paths[0]}" + (f" (+{len(paths) - 1} files)" if len(paths) > 1 else ""))
    return 0
