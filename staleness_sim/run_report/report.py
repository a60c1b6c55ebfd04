"""``staleness-sim report RUN_DIR``: one report of one run, simulated or measured.

Writes ``report.md`` with the figures as PNG files beside it (the worker timeline as
``timeline.png``) and ``report.html`` (the same, figures embedded) into ``RUN_DIR/report/``
or ``--out DIR``. A run with a prediction gets the simulated timeline beside the measured
one. A figure the run cannot draw is listed with the reason instead.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from staleness_sim.core.metrics import summarize
from staleness_sim.core.trace import Trace
from staleness_sim.run_report.figures import FIGURES, Skip
from staleness_sim.run_report.timeline import default_window, timeline_figure
from staleness_sim.sweeps.store import atomic_write

DPI = 110


@dataclass
class Drawn:
    stem: str
    title: str
    figure: object | None  # a matplotlib Figure, or None with ``note`` saying why
    note: str = ""


def is_trace_folder(folder: Path) -> bool:
    return any((folder / f"jobs.{ext}").exists() for ext in ("parquet", "csv"))


def read_evaluations(folder: Path) -> pd.DataFrame | None:
    path = folder / "eval.parquet"
    return pd.read_parquet(path) if path.exists() else None


def run_figures(
    trace: Trace,
    evaluations: pd.DataFrame | None = None,
    predicted: Trace | None = None,
    window: tuple[float, float] | None = None,
) -> list[Drawn]:
    """Every figure of the run (the timeline first), drawn or with the reason it is not."""
    window = window or default_window(trace)
    drawn = [Drawn("timeline", "Worker timeline", timeline_figure(trace, predicted, window))]
    for stem, (title, draw) in FIGURES.items():
        try:
            drawn.append(Drawn(stem, title, draw(trace, evaluations)))
        except Skip as why:
            drawn.append(Drawn(stem, title, None, str(why)))
    return drawn


def write_run_report(
    folder: str | Path,
    out: str | Path | None = None,
    predicted: Trace | None = None,
    window: tuple[float, float] | None = None,
    formats: tuple[str, ...] = ("md", "html"),
) -> list[Path]:
    """Write the report of the trace folder ``folder``; returns the paths written."""
    folder = Path(folder)
    trace = Trace.read(folder)
    out = Path(out) if out is not None else folder / "report"
    out.mkdir(parents=True, exist_ok=True)
    drawn = run_figures(trace, read_evaluations(folder), predicted, window)
    pngs = []
    for d in drawn:
        if d.figure is not None:
            path = out / f"{d.stem}.png"
            atomic_write(path, lambda p, f=d.figure: f.savefig(p, format="png", dpi=DPI))
            pngs.append(path)
    name = trace.meta.get("scenario", {}).get("name") or folder.name
    intro = _intro(trace, folder, predicted is not None)
    table = _summary_rows(trace)
    written = []
    if "md" in formats:
        parts = [f"# Run report: {name}", "", intro, "", *_markdown_table(table), ""]
        for d in drawn:
            parts += [f"## {d.title}", ""]
            parts += [f"![{d.title}]({d.stem}.png)" if d.figure else f"*{d.note}*", ""]
        path = out / "report.md"
        atomic_write(path, lambda p: p.write_text("\n".join(parts)))
        written.append(path)
    if "html" in formats:
        path = out / "report.html"
        page = _html_page(name, intro, table, drawn, out)
        atomic_write(path, lambda p: p.write_text(page))
        written.append(path)
    return written + pngs


def _intro(trace: Trace, folder: Path, with_prediction: bool) -> str:
    source = trace.meta.get("source", "unknown")
    text = f"A {source} run, from `{folder}`."
    if with_prediction:
        text += " The timeline shows the simulator's prediction of it below the measurement."
    return text


def _summary_rows(trace: Trace) -> list[tuple[str, str]]:
    s = summarize(trace)
    return [
        ("wall clock", f"{s['wall_clock_s']:.1f} s"),
        ("updates", f"{s['updates']} ({s['updates_per_hour']:.3g} per hour)"),
        ("results used / discarded", f"{s['results_accepted']} / {s['results_discarded']}"),
        ("worker idle", f"{100 * s['worker_idle_fraction']:.1f} %"),
        ("stale share of used results", f"{100 * s['stale_fraction']:.1f} %"),
        ("lag mean / max", f"{s['mean_lag']:.3f} / {s['max_lag']}"),
        ("data utilisation", f"{100 * s['data_utilization']:.1f} %"),
    ]


def _markdown_table(rows: list[tuple[str, str]]) -> list[str]:
    return ["| metric | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]


def _html_page(name, intro, table, drawn: list[Drawn], out: Path) -> str:
    esc = html.escape
    body = [f"<h1>Run report: {esc(name)}</h1>", f"<p>{esc(intro.replace('`', ''))}</p>"]
    body.append(
        "<table>" + "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in table)
        + "</table>"
    )  # fmt: skip
    for d in drawn:
        body.append(f"<h2>{esc(d.title)}</h2>")
        if d.figure is None:
            body.append(f"<p><em>{esc(d.note)}</em></p>")
        else:
            b64 = base64.b64encode((out / f"{d.stem}.png").read_bytes()).decode()
            body.append(f'<img alt="{esc(d.title)}" src="data:image/png;base64,{b64}">')
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(name)}</title>"
        "<style>body{font-family:sans-serif;max-width:1400px;margin:auto}img{max-width:100%}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;"
        "text-align:left}</style></head><body>" + "\n".join(body) + "</body></html>"
    )
