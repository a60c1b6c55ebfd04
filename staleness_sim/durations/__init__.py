"""What a job costs: duration specs (config), models (samplers) and jobs (makespans).

Maximum-likelihood fitting of these models to measurements is in
``staleness_sim.validation.fitting``.
"""

from staleness_sim.durations.engine_model import CurveSpec, Engine, EngineSpec, RooflineSpec
from staleness_sim.durations.jobs import (
    DirectJob,
    EpisodicJob,
    make_job,
    makespan,
    stream_blocks,
)
from staleness_sim.durations.models import DurationModel, make_duration
from staleness_sim.durations.specs import (
    ConstantSpec,
    DurationSpec,
    EmpiricalSpec,
    ExponentialSpec,
    GammaSpec,
    LognormalSpec,
    LomaxSpec,
    MixtureSpec,
    WeibullSpec,
    read_column,
)
from staleness_sim.durations.turns import CpuShare, TurnJob, TurnsSpec, TurnTable

__all__ = [
    "ConstantSpec",
    "CurveSpec",
    "Engine",
    "EngineSpec",
    "RooflineSpec",
    "TurnJob",
    "TurnTable",
    "CpuShare",
    "TurnsSpec",
    "DirectJob",
    "DurationModel",
    "DurationSpec",
    "EmpiricalSpec",
    "EpisodicJob",
    "ExponentialSpec",
    "GammaSpec",
    "LognormalSpec",
    "LomaxSpec",
    "MixtureSpec",
    "WeibullSpec",
    "make_duration",
    "make_job",
    "makespan",
    "read_column",
    "stream_blocks",
]
