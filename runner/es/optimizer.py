"""ESOptimizer: perturb / restore / update of any torch.nn.Module around an fp32 master copy.

Why a master copy: the working weights may be bf16 or fp16, where an update of ~1e-4 is
below half an ulp of most weights and an in-place add silently drops it, and where
``w + sigma*eps - sigma*eps != w``. So the optimizer keeps an fp32 master, perturbs by
writing ``cast(master + sign*sigma*eps)`` into the working weights, restores by writing
``cast(master)`` (bit-exact by construction) and adds every update to the master in fp32.

Two kernels do the passes (``kernel=``, recorded in :meth:`ESOptimizer.config`):

* ``torch``: chunk by chunk over the flattened parameters, so the only extra memory is a
  per-thread workspace of one noise chunk (plus one accumulator chunk for updates); any
  scheme, any device;
* ``triton`` (philox-v2 only): :mod:`runner.es.philox_triton`, one fused pass per tensor
  that draws and applies the noise (an update of K seeds in one pass, no chunk buffers).

``auto`` takes ``triton`` for philox-v2 on CUDA where Triton imports, ``torch`` elsewhere.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from runner.es.noise import (
    DEFAULT_BLOCK,
    NOISE_SCHEME,
    PHILOX_SCHEME,
    PhiloxScratch,
    check_scheme,
    check_seed,
    fill_noise,
    stream_state,
    uses_philox,
)
from runner.es.records import Result, UpdateRecord
from runner.es.staleness import StalenessRule
from runner.es.update_rule import UpdateRule

DEFAULT_CHUNK = 2**18  # elements; 1 MiB of fp32 noise per thread (cache-sized: fastest measured)
NOISE_KERNELS = ("auto", "torch", "triton")


def _triton_module() -> tuple[Any, str]:
    """(runner.es.philox_triton, "") where Triton imports, else (None, the reason)."""
    try:
        from runner.es import philox_triton
    except ImportError as exc:  # Triton is optional (the test extra installs it)
        return None, str(exc)
    return philox_triton, ""


def resolve_kernel(kernel: str, scheme: str, device: torch.device) -> str:
    """The kernel that will run: ``torch`` or ``triton``; ``auto`` takes ``triton`` for
    philox-v2 on CUDA where Triton imports. An impossible explicit choice is a ValueError."""
    if kernel not in NOISE_KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(NOISE_KERNELS)}, got {kernel!r}")
    if kernel == "torch":
        return "torch"
    module, why = _triton_module()
    if kernel == "auto":
        fits = scheme == PHILOX_SCHEME and device.type == "cuda" and module is not None
        return "triton" if fits else "torch"
    if scheme != PHILOX_SCHEME:
        raise ValueError(f"kernel='triton' draws {PHILOX_SCHEME} noise only, not {scheme!r}")
    if module is None:
        raise ValueError(f"kernel='triton' needs Triton (pip install triton): {why}")
    if not module.usable_on(device):
        raise ValueError(
            f"kernel='triton' runs on CUDA (or on CPU in Triton's interpreter, "
            f"TRITON_INTERPRET=1); the model is on {device.type}"
        )
    return "triton"


@dataclass
class _Workspace:
    """Per-thread scratch: one generator (blockseed-v1) or Philox scratch (philox-v2) and
    lazily allocated chunk buffers per device."""

    generators: dict[torch.device, torch.Generator] = field(default_factory=dict)
    philox: dict[torch.device, PhiloxScratch] = field(default_factory=dict)
    noise: dict[torch.device, torch.Tensor] = field(default_factory=dict)
    acc: dict[torch.device, torch.Tensor] = field(default_factory=dict)

    def get(self, kind: str, device: torch.device, size: int) -> torch.Tensor:
        store = self.noise if kind == "noise" else self.acc
        buf = store.get(device)
        if buf is None:
            buf = store[device] = torch.empty(size, dtype=torch.float32, device=device)
        return buf

    def generator(self, device: torch.device) -> torch.Generator:
        gen = self.generators.get(device)
        if gen is None:
            gen = self.generators[device] = torch.Generator(device=device)
        return gen

    def scratch(self, device: torch.device, chunk: int) -> PhiloxScratch:
        sc = self.philox.get(device)
        if sc is None:
            sc = self.philox[device] = PhiloxScratch(device, chunk)
        return sc

    def nbytes(self) -> int:
        chunks = (*self.noise.values(), *self.acc.values())
        return sum(t.numel() * t.element_size() for t in chunks) + sum(
            sc.nbytes() for sc in self.philox.values()
        )


def _name_filter(pattern: str) -> Callable[[str, torch.nn.Parameter], bool]:
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"params {pattern!r} is not a regular expression: {exc}") from None
    return lambda name, _: regex.search(name) is not None


class ESOptimizer:
    """Evolution strategies on the floating-point parameters of ``model``.

    Args:
        model: any module; its floating parameters (``named_parameters()``, tied weights
            once) are optimized, or those accepted by ``include(name, param)``, or those whose
            name ``params`` (a regular expression, searched; recorded in checkpoints) matches:
            ES over fewer dimensions estimates its gradient with fewer members.
        sigma: perturbation scale (> 0). alpha: step size (>= 0); 1/sigma is folded in.
        shaping: ``"zscore"`` (published), ``"centered_rank"`` or ``"raw"``.
        antithetic: when True a cohort must hold each seed with sign +1 and -1; a seed whose
            partner is missing (e.g. dropped as stale) is dropped too.
        staleness: ``"none"``, ``"drop_over:K"``, ``"lag_weighted:GAMMA"`` or a rule object.
        chunk_size: elements per chunk (a multiple of ``noise_block``); the extra memory.
        noise_block: elements per independently seeded noise block (part of the
            blockseed-v1 stream definition, see :mod:`runner.es.noise`; recorded in
            checkpoints; philox-v2 values do not depend on it).
        noise: the noise scheme, ``"blockseed-v1"`` (default: torch.randn per block, differs
            between CPU and CUDA) or ``"philox-v2"`` (counter-based, the same on any device
            up to ulps of log/cos/sin) or ``"lowrank-v1-r<R>"``
            (each matrix moves along rank-R factors drawn from the seed, as in EGGROLL;
            device-independent as philox-v2). Recorded in checkpoints and
            in the records ``step`` makes; replaying a record of another scheme is an error.
        threads: CPU threads that process chunks in parallel (each has its own workspace).
        kernel: ``"auto"`` (default), ``"torch"`` or ``"triton"``: what draws and applies
            the noise (see the module docstring); the values are the scheme's either way
            (docs/es.md, "Noise kernels"). The kernel that runs is :attr:`kernel`.
        hash_base: hash the base weights now, so checkpoints can name them.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        sigma: float = 0.0015,
        alpha: float = 0.00075,
        shaping: str = "zscore",
        antithetic: bool = False,
        staleness: str | StalenessRule | None = "none",
        *,
        chunk_size: int = DEFAULT_CHUNK,
        noise_block: int = DEFAULT_BLOCK,
        noise: str = NOISE_SCHEME,
        threads: int = 1,
        kernel: str = "auto",
        include: Callable[[str, torch.nn.Parameter], bool] | None = None,
        params: str | None = None,
        hash_base: bool = True,
    ) -> None:
        self.rule = UpdateRule(sigma, alpha, shaping, antithetic, staleness, noise)
        self.params = params
        if params is not None:
            if include is not None:
                raise ValueError("give include or params, not both")
            include = _name_filter(params)
        self.noise_scheme = check_scheme(noise)
        if not isinstance(noise_block, int) or noise_block < 1:
            raise ValueError(f"noise_block must be a positive integer, got {noise_block!r}")
        if not isinstance(chunk_size, int) or chunk_size < noise_block or chunk_size % noise_block:
            raise ValueError(
                f"chunk_size must be a positive multiple of noise_block={noise_block}, got {chunk_size!r}"
            )
        if not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
        self.chunk_size = chunk_size
        self.noise_block = noise_block
        self.threads = threads
        self.model = model

        self._names: list[str] = []
        self._params: list[torch.Tensor] = []  # flat views of the working weights
        self._masters: list[torch.Tensor] = []  # flat fp32 (fp64 for fp64 params) masters
        self._shapes: list[torch.Size] = []
        for name, p in model.named_parameters():
            if not p.is_floating_point() or (include is not None and not include(name, p)):
                continue
            if not p.is_contiguous():
                raise ValueError(f"parameter {name!r} is not contiguous; call .contiguous() first")
            flat = p.detach().view(-1)
            master_dtype = torch.float64 if p.dtype == torch.float64 else torch.float32
            self._names.append(name)
            self._params.append(flat)
            self._masters.append(flat.to(master_dtype, copy=True))
            self._shapes.append(p.shape)
        if not self._names:
            if params is not None:
                some = ", ".join(n for n, _ in list(model.named_parameters())[:4])
                raise ValueError(
                    f"params {params!r} matches no parameter (names look like: {some})"
                )
            raise ValueError("model has no floating-point parameters to optimize")
        self.kernel = resolve_kernel(kernel, self.noise_scheme, self._params[0].device)
        self._fused = None if self.kernel == "torch" else _triton_module()[0]
        # the tensors the fused kernel passes whole (fp64 masters stay on the torch path)
        self._fused_tensors = [
            i for i, m in enumerate(self._masters) if self._fused and m.dtype == torch.float32
        ]
        self._tasks = [
            (i, start, min(start + chunk_size, flat.numel()))
            for i, flat in enumerate(self._params)
            if i not in self._fused_tensors
            for start in range(0, flat.numel(), chunk_size)
        ]
        self._workspaces = [_Workspace() for _ in range(threads)]
        self._pool: ThreadPoolExecutor | None = None
        self._version = 0
        self.log: list[UpdateRecord] = []
        self._active: tuple[int, int] | None = None
        self._base_hash: str | None = self.weights_hash() if hash_base else None

    # ------------------------------------------------------------------ properties
    sigma = property(lambda self: self.rule.sigma)
    alpha = property(lambda self: self.rule.alpha)
    shaping = property(lambda self: self.rule.shaping)
    antithetic = property(lambda self: self.rule.antithetic)
    staleness = property(lambda self: self.rule.staleness)

    @property
    def version(self) -> int:
        """Number of committed updates."""
        return self._version

    @property
    def active(self) -> tuple[int, int] | None:
        """(seed, sign) of the perturbation in force, or None."""
        return self._active

    @property
    def device_type(self) -> str:
        return self._params[0].device.type

    @property
    def base_hash(self) -> str | None:
        """sha256 of the base weights (names, dtypes, shapes, bytes), or None if not hashed."""
        return self._base_hash

    @property
    def num_parameters(self) -> int:
        return sum(t.numel() for t in self._params)

    @property
    def workspace_bytes(self) -> int:
        """Bytes of scratch buffers allocated so far (the extra memory beyond the master)."""
        return sum(ws.nbytes() for ws in self._workspaces)

    def master_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, master tensor in the parameter's shape); views of the live master, do not modify."""
        for name, m, shape in zip(self._names, self._masters, self._shapes, strict=True):
            yield name, m.view(shape)

    def weights_hash(self) -> str:
        """sha256 of the current working weights (chunked host copies for device tensors)."""
        h = hashlib.sha256()
        for name, flat, shape in zip(self._names, self._params, self._shapes, strict=True):
            h.update(f"{name}|{flat.dtype}|{tuple(shape)}\n".encode())
            raw = flat.view(torch.uint8) if flat.numel() else flat.new_empty(0, dtype=torch.uint8)
            for s in range(0, raw.numel(), 1 << 26):
                piece = raw[s : s + (1 << 26)].cpu()
                h.update(piece.numpy().data)
        return h.hexdigest()

    # ------------------------------------------------------------------ chunk engine
    def _run(self, fn: Callable[[int, int, int, _Workspace], None]) -> None:
        """Apply fn(param_index, start, end, workspace) to every chunk, on ``threads`` threads.

        The chunks always run on the optimizer's own worker threads, each limited to one
        intra-op thread: the per-chunk ops are small and cache-resident, and letting OpenMP
        split them across cores costs more than it saves (measured: ~4x slower on 2 cores).
        The limit is per thread, so the caller's torch thread count is untouched.
        """
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                self.threads, thread_name_prefix="es-chunk", initializer=torch.set_num_threads,
                initargs=(1,),
            )  # fmt: skip

        def worker(k: int) -> None:
            ws = self._workspaces[k]
            for task in self._tasks[k :: self.threads]:
                fn(*task, ws)

        for fut in [self._pool.submit(worker, k) for k in range(self.threads)]:
            fut.result()

    def _noise_chunk(
        self, i: int, start: int, end: int, ws: _Workspace, seed: int, stream: Any
    ) -> torch.Tensor:
        """eps(seed) of parameter i, elements [start, end), in the thread's noise buffer."""
        device = self._masters[i].device
        noise = ws.get("noise", device, self.chunk_size)[: end - start]
        philox = uses_philox(self.noise_scheme)
        fill_noise(
            noise,
            seed,
            self._names[i],
            start,
            block=self.noise_block,
            scheme=self.noise_scheme,
            generator=None if philox else ws.generator(device),
            scratch=ws.scratch(device, self.chunk_size) if philox else None,
            stream=stream,
            numel=self._params[i].numel(),
            shape=tuple(self._shapes[i]),
        )
        return noise

    def _fused_keys(self, keys: list[list[tuple[int, int]]]) -> torch.Tensor:
        """The fused tensors' Philox keys, ``keys[k][i]`` of entry k and tensor i, as one
        (tensors, K, 2) int64 tensor on the device (one host-to-device copy)."""
        rows = [[entry[i] for entry in keys] for i in self._fused_tensors]
        return torch.tensor(rows, dtype=torch.int64).to(self._masters[0].device)

    @torch.no_grad()
    def _write_perturbed(self, seed: int, scale: float) -> None:
        streams = [stream_state(seed, name, self.noise_scheme) for name in self._names]
        if self._fused_tensors:
            keys = self._fused_keys([streams])
            coef = self._fused.coef_tensor([scale], keys.device)
            for row, i in enumerate(self._fused_tensors):
                self._fused.perturb(self._params[i], self._masters[i], keys[row], coef)

        def fn(i: int, start: int, end: int, ws: _Workspace) -> None:
            master = self._masters[i][start:end]
            noise = self._noise_chunk(i, start, end, ws, seed, streams[i])
            # Separate mul and add (no fused multiply-add) so the rounding of every element
            # is the same whatever the chunking, vector width or thread count.
            noise.mul_(scale)
            if master.dtype == torch.float32:
                noise.add_(master)
                self._params[i][start:end].copy_(noise)
            else:  # fp64 parameters keep an fp64 master: add in fp64
                work = self._params[i][start:end]
                work.copy_(noise)
                work.add_(master)

        self._run(fn)

    @torch.no_grad()
    def _sync_working(self) -> None:
        for i in self._fused_tensors:  # one copy per tensor: on a GPU a chunk is a launch
            self._params[i].copy_(self._masters[i])

        def fn(i: int, start: int, end: int, ws: _Workspace) -> None:
            # Re-cast from the master: bit-exact by construction, never a subtraction.
            self._params[i][start:end].copy_(self._masters[i][start:end])

        self._run(fn)

    @torch.no_grad()
    def _apply_entries(self, entries: Sequence[tuple[int, float]]) -> None:
        # A zero coefficient adds exactly nothing (x + 0.0 * eps == x bit for bit), so its
        # noise is not regenerated: a cohort of equal rewards costs no noise at all.
        entries = [(s, c) for s, c in entries if c != 0.0]
        if not entries:
            return
        streams = [
            [stream_state(s, name, self.noise_scheme) for name in self._names] for s, _ in entries
        ]
        if self._fused_tensors:
            keys = self._fused_keys(streams)
            coefs = self._fused.coef_tensor([c for _, c in entries], keys.device)
            for row, i in enumerate(self._fused_tensors):
                self._fused.update(self._params[i], self._masters[i], keys[row], coefs)

        def fn(i: int, start: int, end: int, ws: _Workspace) -> None:
            master = self._masters[i][start:end]
            acc = ws.get("acc", master.device, self.chunk_size)[: end - start]
            acc.zero_()
            for k, (seed, coef) in enumerate(entries):
                noise = self._noise_chunk(i, start, end, ws, seed, streams[k][i])
                noise.mul_(coef)
                acc.add_(noise)
            # The whole update is summed first, then added once: small terms are not rounded
            # away against the (larger) weights one by one.
            master.add_(acc)
            self._params[i][start:end].copy_(master)

        self._run(fn)

    # ------------------------------------------------------------------ public API
    @contextmanager
    def perturbed(self, seed: int, sign: int = 1) -> Iterator[torch.nn.Module]:
        """Within the block the model holds ``cast(master + sign*sigma*eps(seed))``.

        On exit (also on an exception) the working weights are re-cast from the master,
        which restores them bit-exactly.
        """
        seed = check_seed(seed)
        if sign not in (1, -1):
            raise ValueError(f"sign must be +1 or -1, got {sign!r}")
        if self._active is not None:
            raise RuntimeError(
                f"already perturbed by seed {self._active[0]}; perturbations do not nest"
            )
        self._active = (seed, sign)
        try:
            self._write_perturbed(seed, sign * self.sigma)
            yield self.model
        finally:
            self._sync_working()
            self._active = None

    def make_update(self, results: Iterable[Result | tuple]) -> UpdateRecord:
        """Build (but do not apply) the record that ``step`` would commit for ``results``.

        The record names this optimizer's noise scheme, so that it cannot be replayed with
        another one.
        """
        return self.rule.make(results, self._version)

    def step(self, results: Iterable[Result | tuple]) -> UpdateRecord:
        """Commit one update from ``(seed, reward, dispatch_version[, sign])`` results.

        Staleness rule first (lag = version - dispatch_version), then shaping over the
        accepted cohort, coefficient ``alpha/N * weight * sign * Z_i`` with N accepted;
        the update is accumulated in fp32, added to the master and re-cast into the model.
        A cohort where everything is dropped still commits (an empty update), so versions
        stay aligned with the scheduling policy.
        """
        if self._active is not None:
            raise RuntimeError("step() inside a perturbed() block")
        record = self.make_update(results)
        self.apply(record)
        return record

    def apply(self, record: UpdateRecord | dict[str, Any]) -> None:
        """Apply the next record of a log (``record.version == self.version + 1``)."""
        if isinstance(record, dict):
            record = UpdateRecord.from_dict(record)
        if self._active is not None:
            raise RuntimeError("cannot apply an update inside a perturbed() block")
        if record.version != self._version + 1:
            raise ValueError(f"record has version {record.version}, expected {self._version + 1}")
        if record.noise is not None and record.noise != self.noise_scheme:
            raise ValueError(
                f"record of version {record.version} was made with noise scheme "
                f"{record.noise!r}, this optimizer uses {self.noise_scheme!r}; the noise would "
                f"differ (build it with noise={record.noise!r})"
            )
        self._apply_entries(record.entries)
        self.log.append(record)
        self._version += 1

    def replay(self, log: Iterable[UpdateRecord | dict[str, Any]], upto: int | None = None) -> int:
        """Catch up by regenerating noise from the seeds of ``log``; returns the new version.

        Records this optimizer already holds are checked against its own log (a mismatch
        raises ValueError); later ones are applied in order, up to version ``upto``.
        """
        for rec in log:
            if isinstance(rec, dict):
                rec = UpdateRecord.from_dict(rec)
            if upto is not None and rec.version > upto:
                break
            if rec.version <= self._version:
                if rec.version < 1 or self.log[rec.version - 1].entries != rec.entries:
                    raise ValueError(
                        f"log diverges from this optimizer's log at version {rec.version}"
                    )
                continue
            self.apply(rec)
        if upto is not None and self._version < upto:
            raise ValueError(f"log ends at version {self._version}, cannot reach version {upto}")
        return self._version

    @torch.no_grad()
    def load_master(
        self, tensors: dict[str, torch.Tensor], log: Sequence[UpdateRecord], version: int
    ) -> None:
        """Install a full snapshot of the master taken at ``version`` (with its log)."""
        if set(tensors) != set(self._names):
            missing = sorted(set(self._names) - set(tensors))
            extra = sorted(set(tensors) - set(self._names))
            raise ValueError(
                f"snapshot parameters do not match: missing {missing}, unexpected {extra}"
            )
        for name, master in zip(self._names, self._masters, strict=True):
            src = tensors[name].reshape(-1)
            if src.numel() != master.numel() or src.dtype != master.dtype:
                raise ValueError(f"snapshot tensor {name!r} has the wrong size or dtype")
            master.copy_(src)
        self.log = list(log[:version])
        self._version = version
        self._sync_working()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def config(self) -> dict[str, Any]:
        """Hyper-parameters and the noise definition, as recorded in checkpoints."""
        return {
            **self.rule.config(),
            # recorded only when set, so checkpoints of the whole model read as before
            **({"params": self.params} if self.params is not None else {}),
            "noise": {
                "scheme": self.noise_scheme,
                "block": self.noise_block,
                "device_type": self.device_type,
                "kernel": self.kernel,  # what drew it; either kernel replays the log
            },
        }
