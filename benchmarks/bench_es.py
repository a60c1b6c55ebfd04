"""Speed and memory of the ES core (runner.es) against two ceilings measured in the same run.

Ceilings:
  * randn: ``torch.randn(out=x)`` into one large preallocated fp32 tensor (the raw Gaussian
    generation rate; on CPU one mt19937 stream, single-threaded);
  * copy: ``y.copy_(x)`` of a large preallocated fp32 tensor, reported as tensor bytes per
    second (the memory traffic is twice that: one read, one write).

Throughputs are in GB/s of fp32 parameters (4 bytes x parameters handled per second), the
unit the noise is generated in, so "ratio to randn" says how close a pass comes to the cost
of generating its noise. An update of a cohort of N seeds regenerates N noise tensors, so
its rate is given per seed (N x 4 x params / s).

Noise schemes: the rate of filling a tensor chunk by chunk (as a pass does: one noise
chunk, reused generator / Philox scratch, one intra-op thread) with blockseed-v1
(torch.randn per block), philox-v2 (counter-based, the same on every device; on CPU the
compiled path of runner/es/philox_cpu.py, and "philox-v2/ops" the plain torch ops it
replaced, the same values) and lowrank-v1-r4 (rank-4 factors of a matrix 4096 wide, drawn
with philox-v2), timed alternately, best of the repeats and the spread (slowest / best), as
a ratio to the randn ceiling; on CPU, and on CUDA when one is available (there also the
fused Triton kernel's fill of the whole tensor, "philox-v2/triton").
``--noise`` picks the scheme of the optimizer passes.

Noise kernels (philox-v2): per kernel that runs on the device (torch; triton on CUDA), the
fill rate and the time of a perturbation, a restore and an update of ``--kernel-cohort``
seeds (default 30) as multiples of one copy of the fp32 master (``y.copy_(x)``), all timed
alternately with that copy. The physical floor of a perturbation is about 1.5 copies (read
the fp32 master, write the working weights); of an update, about 2.5 (read and write the
master, write the working weights), whatever the number of seeds.

Peak extra memory: on CPU, the process's peak RSS (VmHWM, reset through
/proc/self/clear_refs) during the call minus the RSS before it; on CUDA,
torch.cuda.max_memory_allocated minus the allocated bytes before it. The first call after a
reset allocates the optimizer's workspace, so it is included. Page-granular (4 KiB) on CPU.

Usage: python benchmarks/bench_es.py [--params 33554432] [--dtype bfloat16] [--threads 1]
                                    [--noise blockseed-v1|philox-v2] [--kernel-params N]
                                    [--kernel-cohort 30]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
from collections.abc import Callable
from pathlib import Path

import torch
from harness import best_time, rounds

from runner.es import DEFAULT_BLOCK, DEFAULT_CHUNK, NOISE_SCHEMES, ESOptimizer
from runner.es.noise import PhiloxScratch, fill_noise, philox_key, stream_state
from runner.es.optimizer import resolve_kernel
from runner.es.schemes import PHILOX_SCHEME, check_scheme

# the schemes the noise-rate table compares; low-rank noise fills a (numel / WIDTH, WIDTH)
# matrix (its factors' rows per chunk, then R products and sums per element)
SCHEMES = (*NOISE_SCHEMES, "lowrank-v1-r4")
WIDTH = 4096


class Blocks(torch.nn.Module):
    """An LLM-like set of tensors: a few big matrices and some small vectors."""

    def __init__(self, params: int, dtype: torch.dtype, device: str, n_mat: int = 8) -> None:
        super().__init__()
        side = int((params // n_mat) ** 0.5)
        g = torch.Generator(device=device).manual_seed(0)
        self.mats = torch.nn.ParameterList(
            torch.nn.Parameter(
                (0.02 * torch.randn(side, side, generator=g, device=device)).to(dtype)
            )
            for _ in range(n_mat)
        )
        self.norms = torch.nn.ParameterList(
            torch.nn.Parameter(torch.ones(side, dtype=dtype, device=device)) for _ in range(n_mat)
        )


def timed(fn: Callable[[], object], device: str, repeats: int) -> float:
    """Best wall time of ``repeats`` calls after one warm-up call (the minimum is the least
    disturbed by other processes sharing the cores)."""
    fn()
    return best_time(fn, device, repeats)


def interleaved(
    fa: Callable[[], object], fb: Callable[[], object], device: str, repeats: int
) -> tuple[float, float]:
    """Best times of two calls timed alternately, so that both see the same machine load."""
    times = rounds({"a": fa, "b": fb}, device, repeats)
    return min(times["a"]), min(times["b"])


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_extra_bytes(fn: Callable[[], object], device: str) -> int:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak RSS to the current RSS
    before = _rss_kib("VmRSS")
    fn()
    return (_rss_kib("VmHWM") - before) * 1024


def fix_malloc_threshold() -> None:
    """Make glibc return every freed allocation >= 64 KiB to the OS at once.

    By default glibc raises its mmap threshold after large frees and then serves later
    buffers from already-resident heap pages, which would hide them from an RSS peak.
    """
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD


def ceilings(device: str, numel: int, block: int, repeats: int) -> tuple[float, float, float]:
    """randn into one large tensor, randn of one noise block (cache-resident), large copy."""
    x = torch.empty(numel, device=device)
    y = torch.empty(numel, device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    y.fill_(0.0)
    t_randn = timed(
        lambda: torch.randn(numel, generator=gen, device=device, out=x), device, repeats
    )
    xb = x[:block]
    reps = max(1, numel // block)

    def blocks() -> None:
        for _ in range(reps):
            torch.randn(block, generator=gen, device=device, out=xb)

    t_block = timed(blocks, device, repeats)
    t_copy = timed(lambda: y.copy_(x), device, repeats)
    return 4 * numel / t_randn / 1e9, 4 * block * reps / t_block / 1e9, 4 * numel / t_copy / 1e9


@contextlib.contextmanager
def one_thread():
    """One intra-op thread, as the optimizer's chunk workers run."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def noise_rates(
    device: str, numel: int, chunk: int, repeats: int
) -> dict[str, tuple[float, float]]:
    """GB/s of fp32 noise (best, and the spread slowest / best): randn into one large
    tensor, and each scheme filled chunk by chunk (the schemes and randn timed alternately,
    so that all see the same machine load)."""
    x = torch.empty(numel, device=device)
    gen = torch.Generator(device=device).manual_seed(0)

    def randn() -> None:
        torch.randn(numel, generator=gen, device=device, out=x)

    def by_chunks(scheme: str, compiled: bool | None = None) -> Callable[[], None]:
        stream = stream_state(1, "bench.weight", scheme)
        scratch = PhiloxScratch(device, chunk, compiled=compiled)

        def run() -> None:
            for s in range(0, numel, chunk):
                fill_noise(x[s : s + chunk], 1, "bench.weight", s, block=DEFAULT_BLOCK,
                           scheme=scheme, generator=gen, scratch=scratch, stream=stream,
                           numel=numel, shape=(numel // WIDTH, WIDTH))  # fmt: skip

        return run

    fns = {"randn": randn, **{scheme: by_chunks(scheme) for scheme in SCHEMES}}
    if device == "cpu":
        fns[f"{PHILOX_SCHEME}/ops"] = by_chunks(PHILOX_SCHEME, compiled=False)
    if resolve_kernel("auto", PHILOX_SCHEME, torch.device(device)) == "triton":
        from runner.es import philox_triton

        key = philox_key(1, "bench.weight")
        fns[f"{PHILOX_SCHEME}/triton"] = lambda: philox_triton.fill(x, key, 0)
    with one_thread():
        times = rounds(fns, device, repeats)
    return {k: (4 * numel / min(ts) / 1e9, max(ts) / min(ts)) for k, ts in times.items()}


def kernel_passes(
    device: str, params: int, dtype: torch.dtype, repeats: int, cohort: int
) -> dict[str, dict[str, tuple[float, float]]]:
    """Per philox-v2 kernel that runs here: :func:`kernel_row`."""
    kernels = ["torch"]
    if resolve_kernel("auto", PHILOX_SCHEME, torch.device(device)) == "triton":
        kernels.append("triton")
    return {k: kernel_row(k, device, params, dtype, repeats, cohort) for k in kernels}


def kernel_row(
    kernel: str, device: str, params: int, dtype: torch.dtype, repeats: int, cohort: int
) -> dict[str, tuple[float, float]]:
    """(best, spread) of the fill in GB/s, of a perturbation, a restore and an update of
    ``cohort`` seeds in copies of the fp32 master, and of that copy in seconds; every pass
    timed alternately with the copy, so that all see the same machine load."""
    opt = ESOptimizer(
        Blocks(params, dtype, device), hash_base=False, noise=PHILOX_SCHEME, kernel=kernel
    )
    p = opt.num_parameters
    x, y = torch.zeros(p, device=device), torch.zeros(p, device=device)
    entries = [(1000 + s, 1e-4 * (s % 5 - 2) + 1e-5) for s in range(cohort)]
    key = philox_key(1, "bench.weight")
    scratch = PhiloxScratch(device, DEFAULT_CHUNK)

    def fill() -> None:
        if kernel == "triton":
            from runner.es import philox_triton

            philox_triton.fill(x, key, 0)
            return
        for s in range(0, p, DEFAULT_CHUNK):
            fill_noise(x[s : s + DEFAULT_CHUNK], 1, "bench.weight", s,
                       scheme=PHILOX_SCHEME, scratch=scratch, stream=key)  # fmt: skip

    fns = {
        "copy": lambda: y.copy_(x),
        "fill": fill,
        "perturb": lambda: opt._write_perturbed(7, 0.0015),
        "restore": opt._sync_working,
        f"update N={cohort}": lambda: opt._apply_entries(entries),
    }
    with one_thread():
        times = rounds(fns, device, repeats)
    opt.close()
    best = {k: min(ts) for k, ts in times.items()}
    spread = {k: max(ts) / min(ts) for k, ts in times.items()}
    row = {"fill": (4 * p / best["fill"] / 1e9, spread["fill"])}
    row |= {k: (best[k] / best["copy"], spread[k]) for k in fns if k not in ("copy", "fill")}
    row["copy"] = (best["copy"], spread["copy"])
    return row


def _scheme(value: str) -> str:
    try:
        return check_scheme(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--params", type=int, default=2**25, help="model parameters (default 33.5M)")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="ESOptimizer chunk threads")
    ap.add_argument("--chunk", type=int, default=DEFAULT_CHUNK, help="chunk size in elements")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cohorts", default="1,4,8", help="cohort sizes N for the update scaling")
    ap.add_argument("--kernel-params", type=int, default=2**23,
                    help="parameters of the kernel table's model (default 8.4M)")  # fmt: skip
    ap.add_argument(
        "--kernel-cohort", type=int, default=30, help="seeds of the kernel table's update"
    )
    ap.add_argument("--noise", default=NOISE_SCHEMES[0], type=_scheme,
                    help="noise scheme of the optimizer passes (or lowrank-v1-r<R>)")  # fmt: skip
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    dev = args.device
    fix_malloc_threshold()

    randn_gbs, block_gbs, copy_gbs = ceilings(dev, args.params, DEFAULT_BLOCK, args.repeats)
    model = Blocks(args.params, dtype, dev)
    es_kw = {"chunk_size": args.chunk, "threads": args.threads, "noise": args.noise}
    opt = ESOptimizer(model, hash_base=False, **es_kw)
    p = opt.num_parameters
    model_bytes = sum(t.numel() * t.element_size() for t in model.parameters())
    fp32_gb = 4 * p / 1e9

    # Peak memory first, on a fresh optimizer state (workspace not yet allocated). One small
    # draw first, so the RSS peak does not count the scheme's kernels' code pages (~7 MiB of
    # libtorch text the first philox-v2 draw faults in; randn's were by the ceilings).
    fill_noise(torch.empty(4096, device=dev), 0, "warm-up", 0, scheme=args.noise, shape=(64, 64))
    ctx = opt.perturbed(1)
    peak_perturb = peak_extra_bytes(ctx.__enter__, dev)
    peak_restore = peak_extra_bytes(lambda: ctx.__exit__(None, None, None), dev)
    cohort = [(s, float(s % 7), 0) for s in range(8)]
    peak_update = peak_extra_bytes(lambda: opt.apply(opt.make_update(cohort)), dev)

    ctx_holder: list = []

    def perturb() -> None:
        c = opt.perturbed(2)
        c.__enter__()
        ctx_holder.append(c)

    def restore() -> None:
        ctx_holder.pop().__exit__(None, None, None)

    t_perturb = timed(lambda: (perturb(), restore()), dev, args.repeats)
    perturb()
    t_restore = timed(opt._sync_working, dev, args.repeats)
    restore()
    t_perturb -= t_restore  # the pair minus a restore: the perturb alone

    ns = [int(n) for n in args.cohorts.split(",")]
    t_update = {}
    for n in ns:
        coh = [(1000 + s, float(s % 5), opt.version) for s in range(n)]
        rec = opt.make_update(coh)
        t_update[n] = timed(lambda rec=rec: opt._apply_entries(rec.entries), dev, args.repeats)

    # Size scaling: the same update (N = max) on a model with a quarter of the parameters.
    small = ESOptimizer(Blocks(args.params // 4, dtype, dev), hash_base=False, **es_kw)
    nmax = max(ns)
    rec = small.make_update([(1000 + s, float(s % 5), 0) for s in range(nmax)])
    rec_big = opt.make_update([(1000 + s, float(s % 5), opt.version) for s in range(nmax)])
    t_small, t_big = interleaved(
        lambda: small._apply_entries(rec.entries),
        lambda: opt._apply_entries(rec_big.entries),
        dev,
        args.repeats,
    )

    def line(name: str, gbs: float) -> str:
        return (
            f"  {name:<14} {gbs:7.3f} GB/s  {gbs / randn_gbs:5.2f} x randn  "
            f"{gbs / block_gbs:5.2f} x block-randn  {gbs / copy_gbs:6.3f} x copy"
        )

    print(f"device={dev} dtype={args.dtype} params={p / 1e6:.1f}M ({model_bytes / 2**20:.0f} MiB "
          f"working, {4 * p / 2**20:.0f} MiB fp32 master) chunk={args.chunk} threads={args.threads} "
          f"torch_threads={torch.get_num_threads()} noise={args.noise}")  # fmt: skip
    print(f"ceilings: randn {randn_gbs:.3f} GB/s, copy {copy_gbs:.3f} GB/s "
          f"(randn = {randn_gbs / copy_gbs:.3f} x copy); randn of one {DEFAULT_BLOCK}-element "
          f"block (cache-resident, what the optimizer calls) {block_gbs:.3f} GB/s")  # fmt: skip
    print("throughput (GB/s of fp32 parameters; update: per seed, N x params):")
    print(line("perturb", fp32_gb / t_perturb))
    print(line("restore", fp32_gb / t_restore))
    for n in ns:
        print(line(f"update N={n}", n * fp32_gb / t_update[n]))
    per = {n: t_update[n] / (n * p) * 1e9 for n in ns}
    print("update cost: " + ", ".join(f"N={n}: {t_update[n]:.3f} s" for n in ns)
          + "; ns per (seed x param): " + ", ".join(f"{per[n]:.2f}" for n in ns))  # fmt: skip
    ns_small = t_small / (nmax * small.num_parameters) * 1e9
    ns_big = t_big / (nmax * p) * 1e9
    print(f"  size scaling at N={nmax}, timed alternately: {small.num_parameters / 1e6:.1f}M params "
          f"{t_small:.3f} s ({ns_small:.2f} ns per seed x param) vs {p / 1e6:.1f}M params "
          f"{t_big:.3f} s ({ns_big:.2f} ns); time ratio {t_big / t_small:.2f} for "
          f"{p / small.num_parameters:.2f}x the parameters")  # fmt: skip
    print("  theory: N noise regenerations + one master pass, t ~ N x params / noise_rate + "
          "params / copy_rate: linear in N and in the model size")  # fmt: skip
    if args.threads == 1 and dev == "cpu":
        two = ESOptimizer(model, hash_base=False, **{**es_kw, "threads": 2})
        t2p = timed(lambda: two._write_perturbed(3, 0.0015), dev, args.repeats)
        rec = two.make_update([(1000 + s, float(s % 5), 0) for s in range(nmax)])
        t2u = timed(lambda: two._apply_entries(rec.entries), dev, args.repeats)
        two._sync_working()
        two.close()
        print(f"  threads=2: perturb (write only) {fp32_gb / t2p:.3f} GB/s = {fp32_gb / t2p / randn_gbs:.2f} "
              f"x randn; update N={nmax} {nmax * fp32_gb / t2u:.3f} GB/s = "
              f"{nmax * fp32_gb / t2u / randn_gbs:.2f} x randn")  # fmt: skip
    print("peak extra memory (bytes above the model + master before the call):")
    for name, b in [
        ("perturb", peak_perturb),
        ("restore", peak_restore),
        ("update N=8", peak_update),
    ]:
        print(f"  {name:<11} {b / 2**20:8.2f} MiB = {b / model_bytes:.4f} x model "
              f"({b / (4 * args.chunk):.2f} fp32 chunks)")  # fmt: skip
    print(f"  optimizer workspace: {opt.workspace_bytes / 2**20:.2f} MiB "
          f"(noise chunk + accumulator chunk per thread"
          f"{' + Philox scratch' if args.noise == 'philox-v2' else ''})")  # fmt: skip
    opt.close()
    small.close()

    # On CUDA every op is a kernel launch: also one fill of the whole tensor (chunk = params).
    runs = [("cpu", args.chunk)]
    if torch.cuda.is_available():
        runs += [("cuda", args.chunk), ("cuda", args.params)]
    for d, chunk in runs:
        r = noise_rates(d, args.params, chunk, args.repeats)
        print(f"noise schemes on {d} ({args.params / 1e6:.1f}M elements in chunks of {chunk}, "
              f"one intra-op thread, timed alternately with randn {r['randn'][0]:.3f} GB/s, "
              f"spread {r['randn'][1]:.2f}):")  # fmt: skip
        base = r[NOISE_SCHEMES[0]][0]
        for name, (gbs, spread) in r.items():
            if name != "randn":
                print(f"  {name:<16} {gbs:7.3f} GB/s  {gbs / r['randn'][0]:5.2f} x randn  "
                      f"{gbs / base:5.2f} x {NOISE_SCHEMES[0]}  spread {spread:.2f}")  # fmt: skip

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for d in devices:
        table = kernel_passes(d, args.kernel_params, dtype, args.repeats, args.kernel_cohort)
        for kernel, row in table.items():
            t_copy, s_copy = row.pop("copy")
            print(f"{PHILOX_SCHEME} kernel {kernel} on {d} ({args.kernel_params / 1e6:.1f}M "
                  f"{args.dtype} params; one copy of the fp32 master {t_copy * 1e3:.2f} ms, "
                  f"spread {s_copy:.2f}):")  # fmt: skip
            gbs, spread = row.pop("fill")
            print(f"  fill     {gbs:9.3f} GB/s          spread {spread:.2f}")
            for name, (copies, spread) in row.items():
                print(f"  {name:<9}{copies:9.1f} x copy          spread {spread:.2f}")


if __name__ == "__main__":
    main()
