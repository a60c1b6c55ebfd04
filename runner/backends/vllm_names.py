"""The name map: which rows of which vLLM tensor hold each Hugging Face parameter.

ES noise is a function of (seed, parameter NAME, block) (:mod:`runner.es.noise`), and the
names are the Hugging Face ones (``model.named_parameters()`` of the ``hf`` backend). vLLM
builds the same network with other tensors: it fuses parameters (Qwen2 and Llama:
``qkv_proj = cat(q_proj, k_proj, v_proj)`` and ``gate_up_proj = cat(gate_proj, up_proj)``
along dim 0, weights and biases alike), pads the embedding and the output head to a
multiple of its vocabulary padding size, and shares one tensor between the embedding and
a tied head. For an update log written by a vLLM worker to replay on the ``hf`` backend
(and for the two backends to evaluate the same perturbation), each fused tensor must get,
row range by row range, exactly the noise of the HF parameters it is made of; padding rows
get none, and a tied head is perturbed once, as HF perturbs it once.

This module is pure torch (no vLLM import), so it is tested on CPU:

* :func:`build_name_map`: HF parameter names and shapes + vLLM tensor names and shapes ->
  one :class:`Piece` per HF parameter, ``(hf_name, vllm_name, rows start:stop)``, validated
  (shapes agree, fused groups are covered exactly, pieces do not overlap, every vLLM
  tensor is accounted for).
* :func:`view_module`: a ``torch.nn.Module`` whose parameters carry the HF names, in HF
  order, and are *views* (shared storage) of those rows of the vLLM tensors. The ES core's
  :class:`~runner.es.ESOptimizer` runs on it unchanged, so perturb, restore (a re-cast from
  the fp32 master, never a subtraction), update and replay are the ES core's own code, and
  a write through a view lands in the engine's tensor.
* :func:`fuse`: the inverse direction (HF tensors -> vLLM-shaped tensors), for tests and
  checks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# vLLM's ``packed_modules_mapping`` for Qwen2 / Llama-family models (fused module name ->
# the HF modules it concatenates, in order along dim 0). A vLLM model class that defines
# its own ``packed_modules_mapping`` overrides this.
PACKED_DEFAULT: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}


@dataclass(frozen=True)
class Piece:
    """HF parameter ``hf_name`` (shape ``shape``) is rows ``[start, stop)`` of ``vllm_name``."""

    hf_name: str
    vllm_name: str
    start: int
    stop: int
    shape: tuple[int, ...]

    @property
    def rows(self) -> int:
        return self.stop - self.start


def _shape(s: Sequence[int] | torch.Size) -> tuple[int, ...]:
    return tuple(int(x) for x in s)


def _fused_group(
    hf_name: str, packed: Mapping[str, Sequence[str]]
) -> tuple[str, list[str], int] | None:
    """(fused vLLM name, the HF names of the group in order, index of ``hf_name``) or None."""
    parts = hf_name.split(".")
    for i in range(len(parts) - 2, -1, -1):  # module components, innermost first
        for fused, members in packed.items():
            if parts[i] in members:
                group = [".".join(parts[:i] + [m] + parts[i + 1 :]) for m in members]
                name = ".".join(parts[:i] + [fused] + parts[i + 1 :])
                return name, group, list(members).index(parts[i])
    return None


def build_name_map(
    hf_shapes: Sequence[tuple[str, Sequence[int]]],
    vllm_shapes: Mapping[str, Sequence[int]],
    packed: Mapping[str, Sequence[str]] | None = None,
    aliases: Iterable[str] = (),
) -> list[Piece]:
    """One :class:`Piece` per HF parameter, in HF order; ValueError names what does not fit.

    Args:
        hf_shapes: ``(name, shape)`` of the HF model's parameters, as
            ``named_parameters()`` lists them (a tied head appears once, or not at all).
        vllm_shapes: vLLM tensor name -> shape (``named_parameters()`` of the engine's model,
            tensor parallel size 1).
        packed: fused module name -> HF module names (default :data:`PACKED_DEFAULT`).
        aliases: vLLM names that share storage with another listed tensor (a tied head
            listed twice): they need no piece of their own.

    Rules: a vLLM tensor with the HF name and shape is that parameter (rows ``[0, n)``); one
    with more rows and the same trailing dims is padded (the embedding, the head): the HF
    rows come first and the rest is padding; a HF name absent from vLLM whose module is
    in ``packed`` lies in the fused tensor at the offset of the group members before it,
    and the group must fill the fused tensor exactly.
    """
    packed = PACKED_DEFAULT if packed is None else packed
    hf = {name: _shape(s) for name, s in hf_shapes}
    if len(hf) != len(hf_shapes):
        raise ValueError("the HF parameter list names a parameter twice")
    vllm = {name: _shape(s) for name, s in vllm_shapes.items()}
    pieces: list[Piece] = []
    for name, shape in hf.items():
        if not shape:
            raise ValueError(f"HF parameter {name!r} is a scalar; the name map needs rows")
        if name in vllm:
            vshape = vllm[name]
            if vshape[1:] != shape[1:] or vshape[0] < shape[0]:
                raise ValueError(
                    f"vLLM tensor {name!r} has shape {vshape}, the HF parameter {shape}: "
                    "neither equal nor padded along dim 0 (tensor parallel size must be 1)"
                )
            pieces.append(Piece(name, name, 0, shape[0], shape))
            continue
        group = _fused_group(name, packed)
        if group is None or group[0] not in vllm:
            raise ValueError(
                f"HF parameter {name!r} has no vLLM tensor: neither {name!r} nor a fused "
                f"tensor of {dict(packed)} exists in the engine's model"
            )
        fused, members, index = group
        missing = [m for m in members if m not in hf]
        if missing:
            raise ValueError(f"fused tensor {fused!r} needs HF parameters {missing}, absent")
        vshape = vllm[fused]
        for m in members:
            if hf[m][1:] != vshape[1:]:
                raise ValueError(
                    f"HF parameter {m!r} {hf[m]} does not stack into vLLM tensor {fused!r} {vshape}"
                )
        total = sum(hf[m][0] for m in members)
        if total != vshape[0]:
            raise ValueError(
                f"vLLM tensor {fused!r} has {vshape[0]} rows, its HF parts {members} have "
                f"{total} (tensor parallel size must be 1)"
            )
        start = sum(hf[m][0] for m in members[:index])
        pieces.append(Piece(name, fused, start, start + shape[0], shape))
    _check_cover(pieces, vllm, set(aliases))
    return pieces


def _check_cover(pieces: list[Piece], vllm: dict[str, tuple[int, ...]], aliases: set[str]) -> None:
    by_tensor: dict[str, list[Piece]] = {}
    for p in pieces:
        by_tensor.setdefault(p.vllm_name, []).append(p)
    for name, ps in by_tensor.items():
        ps = sorted(ps, key=lambda p: p.start)
        for a, b in zip(ps, ps[1:], strict=False):
            if b.start < a.stop:
                raise ValueError(
                    f"HF parameters {a.hf_name!r} and {b.hf_name!r} overlap in {name!r}"
                )
    uncovered = sorted(set(vllm) - set(by_tensor) - aliases)
    if uncovered:
        raise ValueError(
            f"vLLM tensors with no HF counterpart: {uncovered[:5]}"
            + (f" and {len(uncovered) - 5} more" if len(uncovered) > 5 else "")
            + "; the ES noise of their elements would be undefined"
        )


def padding_rows(pieces: Sequence[Piece], vllm_shapes: Mapping[str, Sequence[int]]) -> int:
    """Rows of the vLLM tensors that hold no HF parameter (vocabulary padding)."""
    covered: dict[str, int] = {}
    for p in pieces:
        covered[p.vllm_name] = covered.get(p.vllm_name, 0) + p.rows
    return sum(_shape(vllm_shapes[n])[0] - rows for n, rows in covered.items())


def _plain(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a plain tensor sharing its storage (vLLM parameters are Parameter subclasses)."""
    t = t.detach()
    return t if type(t) is torch.Tensor else t.as_subclass(torch.Tensor)


def hf_views(
    tensors: Mapping[str, torch.Tensor], pieces: Sequence[Piece]
) -> dict[str, torch.Tensor]:
    """HF name -> a view (shared storage) of its rows of the vLLM tensor, in HF order."""
    out = {}
    for p in pieces:
        base = _plain(tensors[p.vllm_name])
        if not base.is_contiguous():
            raise ValueError(f"vLLM tensor {p.vllm_name!r} is not contiguous")
        view = base[p.start : p.stop]
        if _shape(view.shape) != p.shape:
            raise ValueError(
                f"rows {p.start}:{p.stop} of {p.vllm_name!r} have shape {tuple(view.shape)}, "
                f"the HF parameter {p.hf_name!r} {p.shape}"
            )
        out[p.hf_name] = view
    return out


def view_module(tensors: Mapping[str, torch.Tensor], pieces: Sequence[Piece]) -> torch.nn.Module:
    """A module whose ``named_parameters()`` are the HF names, in HF order, as views.

    Writing a parameter of this module writes the rows of the vLLM tensor (the views share
    storage); padding rows belong to no parameter, so nothing ever writes them.
    """
    root = torch.nn.Module()
    for name, view in hf_views(tensors, pieces).items():
        *path, leaf = name.split(".")
        mod = root
        for part in path:
            child = mod._modules.get(part)
            if child is None:
                child = torch.nn.Module()
                mod.add_module(part, child)
            mod = child
        mod.register_parameter(leaf, torch.nn.Parameter(view, requires_grad=False))
    return root


def fuse(
    hf_tensors: Mapping[str, torch.Tensor],
    pieces: Sequence[Piece],
    vllm_shapes: Mapping[str, Sequence[int]],
    *,
    fill: float = 0.0,
) -> dict[str, torch.Tensor]:
    """vLLM-shaped tensors assembled from HF ones (padding rows set to ``fill``)."""
    out: dict[str, torch.Tensor] = {}
    for p in pieces:
        src = hf_tensors[p.hf_name].detach()
        if p.vllm_name not in out:
            out[p.vllm_name] = torch.full(
                _shape(vllm_shapes[p.vllm_name]), fill, dtype=src.dtype, device=src.device
            )
        out[p.vllm_name][p.start : p.stop].copy_(src)
    return out


def hf_parameter_shapes(path: str | Path) -> list[tuple[str, tuple[int, ...]]]:
    """``(name, shape)`` of the HF model at ``path``, in ``named_parameters()`` order.

    Built on the meta device from ``config.json`` alone: no weights are read or allocated.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return [(n, _shape(p.shape)) for n, p in model.named_parameters()]


def engine_tensors(model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], list[str]]:
    """(name -> floating tensor, names aliasing an earlier tensor) of an engine's model."""
    tensors: dict[str, torch.Tensor] = {}
    aliases: list[str] = []
    seen: dict[tuple[int, Any], str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if not p.is_floating_point():
            continue
        key = (p.data_ptr(), _shape(p.shape))
        if key in seen:
            aliases.append(name)
            continue
        seen[key] = name
        tensors[name] = p
    return tensors, aliases
