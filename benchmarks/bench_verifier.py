"""CPU-seconds per episode with the pytest verifier and the light one, interleaved in one run.

Usage: python benchmarks/bench_verifier.py [--episodes 32] [--rounds 1] [--reuse] [--memo]
                                           [--json OUT]

Each episode is a real one of the warm-start model (its commands, recorded by a training
run: ``tests/terminal/data/recorded_episodes.json``) replayed in a fresh container: start,
the commands, the final verifier, removal; generation is left out (the model writes the
same commands whichever verifier judges them). Each episode runs twice in a row, once per
verifier, the order alternating, so both arms see the same machine load.

CPU-seconds of an episode, summed over what works for it (Linux, root, cgroup v1 or v2):
the container's cgroup (its processes: the agent's commands, pytest or the harness), its
containerd shim, this process (the docker SDK client) and the daemons (dockerd,
containerd; shared with anything else using the engine, so noisy where other work runs).
``verify`` is the container's cgroup CPU during the verifier alone. ``--reuse`` adds a third
arm, the light verifier in containers reused after a verified reset (training episodes with
``tasks.reuse_containers``): a reused container's episode counts from where the previous
one's reset left its CPU, through its own reset (the recorded episodes come from ES
cohorts, so their tasks repeat, as in training). ``--memo`` adds the light verifier with
the memo of repeated episodes (``tasks.memo``, audit 0.1): an episode that repeats an earlier
one's commands costs what its play costs (nothing in a container unless it is audited).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from runner.terminal.episode import make_client
from runner.terminal.generator.writer import generate_specs
from runner.terminal.images import ImageBuilder
from runner.terminal.loaders import load_native
from runner.terminal.memo import EpisodeMemo
from runner.terminal.reset import SandboxPool
from runner.terminal.sandbox import Sandbox
from runner.terminal.verifier import verify_final

RECORDED = Path(__file__).parent.parent / "tests" / "terminal" / "data" / "recorded_episodes.json"
TICK = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """utime + stime of one process, seconds (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def daemons() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                comm = (entry / "comm").read_text().strip()
            except OSError:
                continue
            if comm in ("dockerd", "containerd"):
                found.append(int(entry.name))
    return found


def cgroup_cpu(init_pid: int) -> float:
    """CPU seconds of the container's cgroup (cpuacct on v1, cpu.stat on v2)."""
    for line in Path(f"/proc/{init_pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpuacct" in controllers.split(","):
            return int(Path(f"/sys/fs/cgroup/cpuacct{path}/cpuacct.usage").read_text()) / 1e9
        if controllers == "":
            stat = Path(f"/sys/fs/cgroup{path}/cpu.stat")
            if stat.exists():
                usage = dict(line.split() for line in stat.read_text().splitlines())
                return int(usage["usage_usec"]) / 1e6
    raise OSError(f"no CPU accounting found for pid {init_pid}")


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def episode(client, tag, task, commands, arm, pool, memo) -> dict[str, float]:
    """One replayed episode under ``arm`` (pytest, light, light+reuse through ``pool``, or
    light+memo through ``memo``)."""
    verifier = arm.split("+")[0]
    pids = daemons()
    d0, s0, t0 = sum(map(process_cpu, pids)), self_cpu(), time.perf_counter()
    cpu = {"container": 0.0, "shim": 0.0, "verify": 0.0, "reused": False}

    @contextmanager
    def counted() -> Iterator[Sandbox]:
        """A sandbox whose container and shim CPU land in ``cpu`` when the episode ends."""
        started = pool.counts["started"] if pool is not None else 0
        lease = (
            Sandbox.for_task(client, tag, task) if pool is None else pool.lease(client, tag, task)
        )
        with lease as sandbox:
            init_pid = sandbox.container.attrs["State"]["Pid"]
            shim = int(Path(f"/proc/{init_pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            # a reused container's CPU so far was the episodes' before it (its reset included)
            reused = pool is not None and pool.counts["started"] == started
            c0, h0 = (cgroup_cpu(init_pid), process_cpu(shim)) if reused else (0.0, 0.0)
            yield sandbox
            c1, h1 = cgroup_cpu(init_pid), process_cpu(shim)
        if pool is not None and Path(f"/proc/{init_pid}").exists():  # kept: count its reset
            c1, h1 = cgroup_cpu(init_pid), process_cpu(shim)
        cpu.update(container=c1 - c0, shim=h1 - h0, reused=reused)

    def verify(sandbox: Sandbox):
        init_pid = sandbox.container.attrs["State"]["Pid"]
        v0 = cgroup_cpu(init_pid)
        result = verify_final(sandbox, task, verifier=verifier)
        cpu["verify"] = cgroup_cpu(init_pid) - v0
        return result

    if memo is not None:
        with memo.play(tag, task.task_id, counted, 10) as play:
            for command in commands:
                play.run(command, 10)
            result = play.verify(verify)
    else:
        with counted() as sandbox:
            for command in commands:
                sandbox.run(command, 10)
            result = verify(sandbox)
    assert result.verifier == verifier, result.output[-400:]
    own, daemon = self_cpu() - s0, sum(map(process_cpu, pids)) - d0
    return {
        "cpu_s": cpu["container"] + cpu["shim"] + own + daemon,
        "container_s": cpu["container"],
        "verify_s": cpu["verify"],
        "shim_s": cpu["shim"],
        "client_s": own,
        "daemons_s": daemon,
        "wall_s": time.perf_counter() - t0,
        "reused": cpu["reused"],
        "passed": result.passed,
        "graded": result.graded,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=32, help="recorded episodes to replay")
    ap.add_argument("--rounds", type=int, default=1, help="times each episode runs per arm")
    ap.add_argument("--json", type=Path, help="write the per-episode rows here")
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="an arm: light with containers reused after a verified reset (reset.py)",
    )
    ap.add_argument(
        "--memo",
        action="store_true",
        help="an arm: light with the memo of repeated episodes, audit 0.1 (memo.py)",
    )
    args = ap.parse_args()
    arms = ["pytest", "light"] + ["light+reuse"] * args.reuse + ["light+memo"] * args.memo
    pool = SandboxPool(max_idle=16) if args.reuse else None
    memo = EpisodeMemo(audit=0.1) if args.memo else None

    doc = json.loads(RECORDED.read_text())
    specs = dict(generate_specs(doc["tasks"]["n"], doc["tasks"]["seed"]))
    chosen = [e for e in doc["episodes"] if not e["any_timed_out"]][: args.episodes]
    client = make_client()
    builder = ImageBuilder(client)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tasks = {}
        for e in chosen:  # images first, outside the timing
            if e["task_id"] not in tasks:
                task = load_native(specs[e["task_id"]].write(Path(tmp), e["task_id"]))
                tasks[e["task_id"]] = (task, builder.ensure(task).tag)
        for r in range(args.rounds):
            for i, e in enumerate(chosen):
                task, tag = tasks[e["task_id"]]
                k = (i + r) % len(arms)  # each arm first in turn
                order = arms[k:] + arms[:k]
                runs = {
                    a: episode(
                        client,
                        tag,
                        task,
                        e["commands"],
                        a,
                        pool if "+reuse" in a else None,
                        memo if "+memo" in a else None,
                    )  # fmt: skip
                    for a in order
                }
                verdicts = {(x["passed"], x["graded"]) for x in runs.values()}
                assert len(verdicts) == 1, (e["task_id"], runs)
                for a in arms:
                    rows.append({"task_id": e["task_id"], "round": r, "verifier": a, **runs[a]})
    if pool is not None:
        pool.close()
        print("reuse:", dict(pool.counts))
    if memo is not None:
        print("memo:", dict(memo.counts))
    report(rows, arms)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


def report(rows: list[dict], arms: list[str]) -> None:
    keys = ("cpu_s", "container_s", "verify_s", "shim_s", "client_s", "daemons_s", "wall_s")
    means = {}
    for v in arms:
        arm = [r for r in rows if r["verifier"] == v]
        means[v] = {k: statistics.fmean(r[k] for r in arm) for k in keys}
        parts = "  ".join(f"{k} {means[v][k]:.3f}" for k in keys)
        print(f"{v:>11} ({len(arm)} episodes): {parts}")
    # the ratio to pytest per episode (its runs are consecutive rows), and its spread
    n = len(arms)
    episodes = [{r["verifier"]: r for r in rows[k : k + n]} for k in range(0, len(rows), n)]
    for arm in arms[1:]:
        ratios = [e[arm]["cpu_s"] / e["pytest"]["cpu_s"] for e in episodes]
        q1, median, q3 = statistics.quantiles(ratios, n=4)
        print(
            f"{arm} / pytest CPU-s per episode: {means[arm]['cpu_s'] / means['pytest']['cpu_s']:.3f}"
            f" (per episode: median {median:.3f}, quartiles {q1:.3f}-{q3:.3f}); verifier alone: "
            f"{means[arm]['verify_s'] / means['pytest']['verify_s']:.3f}"
        )


if __name__ == "__main__":
    main()
