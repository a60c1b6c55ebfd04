"""One report of one run, simulated or measured (``staleness-sim report RUN_DIR``): the
worker timeline and the run's figures, from the trace schema both kinds of run share."""

from staleness_sim.run_report.figures import FIGURES, Skip
from staleness_sim.run_report.report import is_trace_folder, run_figures, write_run_report
from staleness_sim.run_report.timeline import default_window, timeline_bars, timeline_figure

__all__ = [
    "FIGURES",
    "Skip",
    "default_window",
    "is_trace_folder",
    "run_figures",
    "timeline_bars",
    "timeline_figure",
    "write_run_report",
]
