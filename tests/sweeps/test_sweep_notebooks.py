"""Every notebook executes top to bottom (nbclient, python3 kernel), so none of them rots;
notebooks are committed without outputs."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path):
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "strip outputs"
    client = nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()
    images = sum(
        "image/png" in out.get("data", {})
        for c in nb.cells
        if c.cell_type == "code"
        for out in c.outputs
    )
    assert images >= 3, f"{path.name}: expected figures in the outputs, got {images}"


def test_the_two_notebooks_exist():
    assert {p.name for p in NOTEBOOKS} >= {"whatif_sweeps.ipynb", "lag_vs_success.ipynb"}
