"""benchmarks/bench_batching.py --engine-cpu-out: the file it writes holds fields of the
turn model's ``job.cpu`` (the measured cores by batch, torch's threads), with when, where
and how fast the engine ran as comments."""

from __future__ import annotations

import pytest
import yaml
from conftest import load_benchmark

from staleness_sim.durations import CpuShare

torch = pytest.importorskip("torch")
bench_batching = load_benchmark("bench_batching")


def test_engine_cpu_file_reads_back_with_its_provenance(tmp_path):
    rows = [
        {"sessions": 1, "continuous_tok_s": 79.5, "continuous_cores": 1.09},
        {"sessions": 4, "continuous_tok_s": 140.8, "continuous_cores": 1.31},
        {"sessions": 16, "continuous_tok_s": 209.7, "continuous_cores": 1.66},
    ]
    path = tmp_path / "engine_cpu.yaml"
    bench_batching.write_engine_cpu(path, rows)
    text = path.read_text()
    fields = yaml.safe_load(text)
    CpuShare(cores=2, **fields)  # valid job.cpu fields
    assert fields["engine_threads"] == torch.get_num_threads()
    assert fields["engine_cores"] == {"batch": [1, 4, 16], "cores": [1.09, 1.31, 1.66]}
    comments = [line for line in text.splitlines() if line.startswith("#")]
    assert len(comments) == 2
    assert comments[0].startswith("# measured 20") and " CPUs, load " in comments[0]
    assert comments[1] == "# continuous tokens per second by batch: 1: 79.5, 4: 140.8, 16: 209.7"
