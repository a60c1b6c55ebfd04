"""The engine model: how long one decode step of a worker's engine takes for the batch it
holds, and what a prefill costs per token.

Two ways to give it (the scenario's ``job.engine``):

- ``curve``: a measured table of decode step seconds by batch size (a benchmark, or fitted
  from a run), linear between points and along the last segment beyond them, plus
  optional costs per token of context held in the batch and per prefilled token;
- ``roofline``: the hardware and the model. A decode step reads the weights and every
  sequence's KV cache once and does 2 FLOP per parameter per sequence, so it takes
  ``max((params * bytes_per_param + context * kv_bytes_per_token) / bandwidth,
  2 * params * batch / flops)``; a prefill is compute-bound, ``2 * params / flops`` per
  token. An ideal engine: attention FLOPs, kernel launches and scheduling are left out.
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

NonNegative = Annotated[float, Field(ge=0)]
Positive = Annotated[float, Field(gt=0)]


class _EngineSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class CurveSpec(_EngineSpec):
    """Decode step seconds at each batch size (batch sizes increasing, from 1)."""

    batch: list[Annotated[int, Field(ge=1)]] = Field(min_length=1)
    step_s: list[Positive] = Field(min_length=1)

    @field_validator("batch")
    @classmethod
    def _increasing_batch(cls, v: list[int]) -> list[int]:
        if any(b <= a for a, b in zip(v, v[1:], strict=False)):
            raise ValueError(f"batch sizes must increase, got {v}")
        return v

    @field_validator("step_s")
    @classmethod
    def _increasing_step(cls, v: list[float], info) -> list[float]:
        batch = info.data.get("batch")
        if batch is not None and len(batch) != len(v):
            raise ValueError(f"needs one step time per batch size ({len(batch)}), got {len(v)}")
        for i, (a, b) in enumerate(zip(v, v[1:], strict=False)):
            if b < a:
                at = batch[i + 1] if batch else i + 1
                raise ValueError(
                    f"step time must not decrease as the batch grows ({b:g} s at batch {at} "
                    f"after {a:g} s)"
                )
        return v


class RooflineSpec(_EngineSpec):
    """The hardware and the model; every field is required."""

    params: Positive  # parameters
    bytes_per_param: Positive  # 2 for bf16
    kv_bytes_per_token: NonNegative  # 2 (K, V) * layers * kv_heads * head_dim * bytes
    bandwidth: Positive  # memory bytes per second
    flops: Positive  # dense FLOP per second


class EngineSpec(_EngineSpec):
    """``curve`` (with optional per-token costs) or ``roofline``, exactly one."""

    curve: CurveSpec | None = None
    context_s_per_token: NonNegative = 0.0  # curve: extra step seconds per context token
    prefill_s_per_token: NonNegative = 0.0  # curve: prefill seconds per prompt token
    roofline: RooflineSpec | None = None

    @model_validator(mode="after")
    def _one_form(self) -> EngineSpec:
        if (self.curve is None) == (self.roofline is None):
            raise ValueError("give exactly one of curve or roofline")
        if self.roofline is not None and (self.context_s_per_token or self.prefill_s_per_token):
            raise ValueError("context_s_per_token / prefill_s_per_token go with a curve")
        return self


class Engine:
    """Decode step and prefill times of one worker's engine (vectorised over jobs)."""

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        if spec.curve is not None:
            self._b = np.asarray(spec.curve.batch, dtype=np.float64)
            self._s = np.asarray(spec.curve.step_s, dtype=np.float64)
            slope = (
                (self._s[-1] - self._s[-2]) / (self._b[-1] - self._b[-2])
                if len(self._b) > 1
                else 0.0
            )
            self._slope = float(slope)
            self._ctx = spec.context_s_per_token
            self.prefill_s_per_token = spec.prefill_s_per_token
        else:
            r = spec.roofline
            assert r is not None
            self._weights_s = r.params * r.bytes_per_param / r.bandwidth
            self._kv_s = r.kv_bytes_per_token / r.bandwidth
            self._flop_s = 2.0 * r.params / r.flops  # per sequence per step, per prefill token
            self.prefill_s_per_token = self._flop_s

    def step_s(self, batch: np.ndarray, context: np.ndarray) -> np.ndarray:
        """Seconds of one decode step for ``batch`` sequences holding ``context`` tokens."""
        b = np.asarray(batch, dtype=np.float64)
        ctx = np.asarray(context, dtype=np.float64)
        if self.spec.curve is None:
            return np.maximum(self._weights_s + ctx * self._kv_s, self._flop_s * b)
        out = np.interp(b, self._b, self._s)  # flat below the first point (batch >= 1 anyway)
        beyond = b > self._b[-1]
        if beyond.any():
            out = np.where(beyond, self._s[-1] + self._slope * (b - self._b[-1]), out)
        return out + self._ctx * ctx if self._ctx else out

    def step_terms(self, max_batch: int) -> tuple[np.ndarray, float, float]:
        """``step_s`` as ``(base, per_context, per_batch)`` for a compiled loop: for a
        batch ``b`` of 1 to ``max_batch`` holding ``ctx`` tokens, ``step_s(b, ctx)`` is
        exactly ``max(base[b] + per_context * ctx, per_batch * b)`` (``base[0]`` is
        ``base[1]``)."""
        b = np.maximum(np.arange(max_batch + 1), 1)
        if self.spec.curve is None:
            return np.full(len(b), self._weights_s), self._kv_s, self._flop_s
        # step_s(b, 0) is the curve alone: adding 0 * ctx to it changes no bit
        return self.step_s(b, np.zeros(len(b))), float(self._ctx), 0.0

    def describe(self) -> str:
        if self.spec.curve is not None:
            pts = ", ".join(
                f"{b}: {s:.3g}" for b, s in zip(self._b.astype(int), self._s, strict=True)
            )
            extra = ""
            if self._ctx:
                extra += f" + {self._ctx:.3g} s per context token"
            if self.prefill_s_per_token:
                extra += f", prefill {self.prefill_s_per_token:.3g} s/token"
            return f"decode step s by batch {{{pts}}}{extra}"
        r = self.spec.roofline
        assert r is not None
        return (
            f"roofline: {r.params:.3g} params x {r.bytes_per_param:g} B, KV {r.kv_bytes_per_token:g} "
            f"B/token, {r.bandwidth:.3g} B/s, {r.flops:.3g} FLOP/s"
        )
