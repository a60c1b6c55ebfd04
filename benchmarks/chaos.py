"""Chaos: a CPU training run of configs/runner/cpu_tiny.yaml with faults injected at seeded
random moments, then one table of what the run survived and what it lost.

Faults (kinds):

- ``sigkill``: SIGKILL of the training process at a random moment;
- ``sigkill-commit``: SIGKILL with a commit's journal line half written (a torn line);
- ``sigkill-after-commit``: SIGKILL once a commit is durable, before its checkpoint;
- ``sigkill-checkpoint``: SIGKILL during a checkpoint write (temporary file written, not renamed);
- ``sigkill-eval``: SIGKILL during a held-out evaluation;
- ``sigkill-resume``: SIGKILL in the first second after a ``--resume``;
- ``sigint``, ``sigterm``: Ctrl-C and SIGTERM (the run stops cleanly, exit 130);
- ``docker-kill-episode``: ``docker kill`` of a running episode's container;
- ``docker-kill-verifier``: ``docker kill`` of the container while its verifier runs;
- ``torn-journal``: a torn last line appended to journal.jsonl after a kill;
- ``truncated-trace``: jobs.parquet cut to half and transcripts.jsonl cut mid-line after a kill;
- ``engine-restart`` (``--engine-restart`` only: the engine is shared by everything on the
  machine): the Docker engine stopped and started again while jobs run;
- ``ray-kill``, ``ray-worker-sigkill`` (``--ray``: ``backend: ray``): a worker's Ray actor
  killed with ``ray.kill`` while its job runs, and an actor's process SIGKILLed;
- ``disk-full`` (``--disk-full``, as root): the run directory lives on a small tmpfs, which a
  filler file fills while jobs run; once the run has stopped (or a minute on) the filler is
  removed and the run resumed.

Every kill is followed by ``es-runner train --resume``. In-process moments (a commit, a
checkpoint write, an evaluation, a verifier) are reached by running the trainer through this
file (``--child``), which wraps the function concerned and kills the process from inside at
that moment; nothing of the runner is changed. Losses are counted from the run's files,
independently of the runner's bookkeeping: committed updates lost or applied twice (each
kill's journal commits against the final journal's), versions skipped or repeated, jobs
without a verdict, containers and processes left behind, and the final weights' hash (the
last process's worker, synced to the whole log) against ``es-runner model export`` (a fresh
process rebuilding the weights from the update log).

    python benchmarks/chaos.py --seed 1                # the long form (>= 10 SIGKILLs)
    python benchmarks/chaos.py --short --seed 0        # a few faults, about two minutes
    python benchmarks/chaos.py --seed 1 --engine-restart   # also stops the Docker engine

"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HOOKS = {"sigkill-commit", "sigkill-after-commit", "sigkill-checkpoint", "sigkill-eval"}
IN_PROCESS = HOOKS | {"docker-kill-verifier", "ray-kill"}
ENDS_PROCESS = HOOKS | {"sigkill", "sigkill-resume", "sigint", "sigterm", "disk-full"}
BETWEEN = {"torn-journal", "truncated-trace"}  # applied to a stopped run's files
LONG_PLAN = (
    ["sigkill"] * 4
    + ["sigkill-commit", "sigkill-after-commit", "sigkill-checkpoint", "sigkill-eval"]
    + ["sigkill-resume"] * 2
    + ["sigint", "sigterm", "docker-kill-episode", "docker-kill-episode", "docker-kill-verifier"]
    + ["torn-journal", "truncated-trace"]
)
SHORT_PLAN = ["sigkill-commit", "truncated-trace", "docker-kill-episode", "sigkill-resume"]


# --- the child: the trainer with in-process fault points ---------------------------------
def child(argv: list[str]) -> int:
    """Run ``es-runner ARGV`` with the faults named in $CHAOS_HOOKS armed (each fires once);
    each writes a line to $CHAOS_LOG when it fires."""
    armed = set(filter(None, os.environ.get("CHAOS_HOOKS", "").split(",")))
    log_path = Path(os.environ["CHAOS_LOG"])

    def fired(kind: str, **detail) -> None:
        with open(log_path, "a") as f:
            f.write(json.dumps({"fired": kind, "pid": os.getpid(), **detail}) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    from runner import journal, orchestrator
    from runner.es import checkpoint_file
    from runner.terminal import episode

    append = journal.Journal.append

    def chaos_append(self, event, durable=False):
        if event.get("e") == "commit" and "sigkill-commit" in armed:
            line = json.dumps(event, separators=(",", ":")) + "\n"
            fired("sigkill-commit", version=event["version"])
            self._file.write(line[: len(line) // 2])
            self._file.flush()
            os.fsync(self._file.fileno())
            die()
        append(self, event, durable)
        if event.get("e") == "commit" and "sigkill-after-commit" in armed:
            fired("sigkill-after-commit", version=event["version"])
            die()

    journal.Journal.append = chaos_append
    atomic = checkpoint_file._atomic_write

    def chaos_atomic(path, text):
        if "sigkill-checkpoint" in armed:
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_text(text[: len(text) // 2])  # killed midway through the write
            fired("sigkill-checkpoint")
            die()
        atomic(path, text)

    checkpoint_file._atomic_write = chaos_atomic
    from runner import evaluation

    evaluate = evaluation.evaluate

    def chaos_evaluate(*args, **kwargs):
        if "sigkill-eval" in armed:
            version = kwargs.get("version")

            def later():
                time.sleep(0.5)  # well inside the evaluation's episodes
                fired("sigkill-eval", version=version)
                die()

            threading.Thread(target=later, daemon=True).start()
        return evaluate(*args, **kwargs)

    evaluation.evaluate = chaos_evaluate
    verify = episode.verify_final
    verifier_once = threading.Lock()

    def chaos_verify(sandbox, task, **kwargs):
        if "docker-kill-verifier" in armed and verifier_once.acquire(blocking=False):
            cid = sandbox.container.id
            threading.Timer(0.05, subprocess.run, (["docker", "kill", cid],)).start()
            fired("docker-kill-verifier", container=cid[:12], task=task.task_id)
        return verify(sandbox, task, **kwargs)

    episode.verify_final = chaos_verify
    if "ray-kill" in armed:
        from runner.workers import ray_driver

        run_job = ray_driver.RayWorker.run_job
        ray_once = threading.Lock()

        def chaos_run_job(self, job, abort):
            if ray_once.acquire(blocking=False):

                def kill(actor=self.actor, pid=self.pid):
                    import ray

                    time.sleep(1.0)  # its episodes under way
                    fired("ray-kill", actor_pid=pid)
                    ray.kill(actor)

                threading.Thread(target=kill, daemon=True).start()
            return run_job(self, job, abort)

        ray_driver.RayWorker.run_job = chaos_run_job
    main = orchestrator.Orchestrator._main

    async def chaos_main(self):
        outcome = await main(self)
        if outcome.status == "finished":  # the live weights at the end, for the hash check
            worker = self.workers[0]
            worker.sync(list(self.state.log))
            if hasattr(worker, "actor"):  # a Ray actor: (version, hash) from its process
                import ray

                digest = ray.get(worker.actor.weights_hash.remote())[1]
            else:
                digest = worker.backend.weights_hash()
            with open(log_path, "a") as f:
                line = {"final_hash": digest, "version": outcome.version}
                f.write(json.dumps(line) + "\n")
        return outcome

    orchestrator.Orchestrator._main = chaos_main
    from runner.cli import main as cli_main

    return cli_main(argv)


# --- the driver ------------------------------------------------------------------------------
class Chaos:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.rng = random.Random(args.seed)
        self.run = work / "run"
        self.log_path = work / "chaos.log"
        self.log_path.touch()
        self.pids: list[int] = []
        self.proc: subprocess.Popen | None = None
        self.injected: Counter = Counter()
        self.survived: Counter = Counter()
        self.resumed: Counter = Counter()
        self.not_reached: Counter = Counter()
        self.snapshots: list[tuple[str, list[dict]]] = []  # (fault, journal commits at kill)
        self.exit_codes: list[tuple[str, int | None]] = []
        self.restarts = 0
        self.to_survive: list[str] = []  # faults the running process has met so far
        self.disk_full_exits: list[int | None] = []
        self.segment_codes: dict[str, int | None] = {}

    # -- processes --------------------------------------------------------------------------
    def start(self, hooks: set[str]) -> None:
        if self.proc is None and not self.run.exists():
            args = [str(self.args.config_path), "--out", str(self.run)]
        else:
            args = ["--resume", str(self.run)]
            self.restarts += 1
        env = {**os.environ, "CHAOS_HOOKS": ",".join(sorted(hooks))}
        env["CHAOS_LOG"] = str(self.log_path)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        out = open(self.work / f"segment-{len(self.pids)}.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--child", "train", *args, "--no-progress"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.started = time.monotonic()
        self.pids.append(self.proc.pid)

    def segment_ended(self, code: int | None) -> None:
        """The process met its faults without help if it ended only as planned: killed by
        us or a hook (-9), stopped by Ctrl-C/SIGTERM (130), or at the run's end (0)."""
        for kind in self.to_survive:
            self.survived[kind] += code in (0, 130, -signal.SIGKILL)
        self.to_survive = []
        self.segment_codes[f"segment-{len(self.pids) - 1}.log"] = code

    def _docker_kill_one(self) -> bool:
        boxes = self.sandboxes()
        if not boxes:
            return False
        time.sleep(self.rng.uniform(0.0, 0.3))  # into the episode
        target = self.rng.choice(boxes)["Id"]
        done = subprocess.run(["docker", "kill", target], capture_output=True, timeout=60)
        return done.returncode == 0

    def actor_pids(self) -> list[int]:
        """The run's Ray actors, from run.log (``worker i: Ray actor pid P on HOST``); those
        of earlier processes exited with them."""
        path = self.run / "run.log"
        text = path.read_text() if path.exists() else ""
        return [
            int(line.split(": Ray actor pid ")[1].split()[0])
            for line in text.splitlines()
            if ": Ray actor pid " in line
        ]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_exit(self, timeout: float) -> int | None:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self, sig: int) -> None:
        if self.alive():
            os.kill(self.proc.pid, sig)

    def fired(self, kind: str) -> bool:
        pid = self.proc.pid if self.proc else -1
        for line in self.log_path.read_text().splitlines():
            ev = json.loads(line)
            if ev.get("fired") == kind and ev.get("pid") == pid:
                return True
        return False

    # -- reading the run ------------------------------------------------------------------
    def events(self) -> list[dict]:
        from runner.journal import read_events

        return read_events(self.run / "journal.jsonl")[0]

    def commits(self) -> list[dict]:
        return [e for e in self.events() if e["e"] == "commit"]

    def wait_for(self, condition, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                return False
            if condition():
                return True
            time.sleep(0.1)
        return False

    def jobs_running(self) -> bool:
        """Whether this process runs a job (a resumed journal lists the dead one's until the
        new process has started and cancelled them: only events after its segment count)."""
        ev = self.events() if (self.run / "journal.jsonl").exists() else []
        mine = [
            i for i, e in enumerate(ev) if e["e"] == "segment" and e.get("pid") == self.proc.pid
        ]
        if not mine:
            return False
        ev = ev[mine[0] :]
        started = {e["job"] for e in ev if e["e"] == "run"}
        return bool(started - {e["job"] for e in ev if e["e"] in ("result", "cancel")})

    def sandboxes(self, running_only: bool = True) -> list[dict]:
        from runner.terminal.reaper import LABEL_OWNER, LABEL_SANDBOX

        out, owners = [], set(self.pids) | set(self.actor_pids())
        if self.alive():  # Ray's actors descend from the driver (through its raylet)
            owners |= _descendants(self.proc.pid)
        for c in self.docker.api.containers(all=not running_only, filters={"label": LABEL_SANDBOX}):
            owner = json.loads((c.get("Labels") or {}).get(LABEL_OWNER, "{}") or "{}")
            if owner.get("pid") in owners:
                out.append(c)
        return out

    # -- faults -----------------------------------------------------------------------------
    def inject(self, kind: str) -> None:
        """One fault on the running process (started with its hook armed if it has one)."""
        if kind in HOOKS:
            code = self.wait_exit(self.args.hook_timeout)
            if code is None or not self.fired(kind):
                self.not_reached[kind] += 1
                self.kill(signal.SIGKILL)  # the moment never came: end the segment anyway
                self.wait_exit(30)
                self.snapshots.append(("sigkill", self.commits()))
                self.injected["sigkill"] += 1
                self.resumed["sigkill"] += 1
                return
            self.injected[kind] += 1
            self.resumed[kind] += 1
            self.snapshots.append((kind, self.commits()))
            return
        if kind == "sigkill-resume":
            time.sleep(max(0.0, self.started + self.rng.uniform(0.05, 1.0) - time.monotonic()))
        elif kind in ("sigkill", "sigint", "sigterm"):
            self.wait_for(self.jobs_running, 120)  # during the run, not its start-up
            time.sleep(self.rng.uniform(0.0, self.args.max_delay))
        if not self.alive():
            self.not_reached[kind] += 1
            return
        if kind in ("sigkill", "sigkill-resume"):
            self.kill(signal.SIGKILL)
            self.wait_exit(30)
            self.injected[kind] += 1
            self.resumed[kind] += 1
            self.snapshots.append((kind, self.commits()))
        elif kind in ("sigint", "sigterm"):
            self.kill(signal.SIGINT if kind == "sigint" else signal.SIGTERM)
            code = self.wait_exit(120)
            self.injected[kind] += 1
            self.exit_codes.append((kind, code))
            if code is None:  # it did not stop by itself
                self.kill(signal.SIGKILL)
                self.wait_exit(30)
            self.resumed[kind] += 1
            self.snapshots.append((kind, self.commits()))
        elif kind == "docker-kill-episode":
            # a container that lives a second or two: kill one as soon as it is seen running
            killed = self.wait_for(lambda: self._docker_kill_one(), 120)
            if not killed:
                self.not_reached[kind] += 1
                return
            self.injected[kind] += 1
            self.to_survive.append(kind)
        elif kind in ("docker-kill-verifier", "ray-kill"):
            if self.wait_for(lambda: self.fired(kind), self.args.hook_timeout) or self.fired(kind):
                self.injected[kind] += 1
                self.to_survive.append(kind)
            else:
                self.not_reached[kind] += 1
        elif kind == "ray-worker-sigkill":
            self.wait_for(self.jobs_running, 120)
            time.sleep(self.rng.uniform(0.0, self.args.max_delay))
            pids = [p for p in self.actor_pids() if _alive(p)]
            if not self.alive() or not pids:
                self.not_reached[kind] += 1
                return
            os.kill(self.rng.choice(pids), signal.SIGKILL)
            self.injected[kind] += 1
            self.to_survive.append(kind)
        elif kind == "disk-full":
            self.wait_for(self.jobs_running, 120)
            time.sleep(self.rng.uniform(0.0, self.args.max_delay))
            if not self.alive():
                self.not_reached[kind] += 1
                return
            filler = self.run.parent / "filler"
            with open(filler, "wb") as f, contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * 2**20)
                    f.flush()
            self.injected[kind] += 1
            code = self.wait_exit(60)
            self.disk_full_exits.append(code)
            if code is None:
                self.survived[kind] += 1  # still running on a full disk
            else:
                self.resumed[kind] += 1
                self.snapshots.append((kind, self.commits()))
            filler.unlink()
        elif kind == "engine-restart":
            self.wait_for(self.jobs_running, 120)
            engine_restart(self.args.engine_stop_s)
            self.injected[kind] += 1
            self.to_survive.append(kind)

    def damage_files(self, kind: str) -> None:
        """A stopped run's files as a kill mid-write can leave them."""
        if kind == "torn-journal":
            with open(self.run / "journal.jsonl", "ab") as f:
                f.write(b'{"e":"result","job":')
        else:
            for name in ("jobs.parquet", "transcripts.jsonl"):
                path = self.run / name
                if path.exists() and path.stat().st_size > 2:
                    size = path.stat().st_size
                    cut = size // 2 if name.endswith(".parquet") else size - 7
                    os.truncate(path, cut)
        self.injected[kind] += 1
        self.resumed[kind] += 1  # found by the next --resume

    # -- the run ----------------------------------------------------------------------------
    def plan(self) -> list[list[str]]:
        """Segments: each the faults one process meets, the last of them ending it (a kill at
        a random moment, Ctrl-C, SIGTERM, or an in-process moment); faults that end no
        process (a container killed, the engine restarted) go before a random-moment ending,
        so that a commit or evaluation hook cannot end the process before they come (else
        before the first ending); damage to a stopped run's files goes between."""
        faults = list(SHORT_PLAN if self.args.short else LONG_PLAN)
        if self.args.engine_restart:
            faults.append("engine-restart")
        if self.args.disk_full:
            faults.append("disk-full")
        if self.args.ray:
            faults += ["ray-kill", "ray-worker-sigkill"]
        self.rng.shuffle(faults)
        ending = [f for f in faults if f in ENDS_PROCESS and f != "sigkill-resume"]
        segments = [[f] for f in ending]
        timed = [seg for seg in segments if seg[-1] in ("sigkill", "sigint", "sigterm")]
        for f in faults:
            if f in ENDS_PROCESS or f in BETWEEN:
                continue
            self.rng.choice(timed or segments[:1] or [segments]).insert(0, f)
        for f in (f for f in faults if f in BETWEEN):  # after a stopped process
            segments.insert(self.rng.randint(1, max(1, len(ending))), [f])
        for f in (f for f in faults if f == "sigkill-resume"):  # after a resume
            segments.insert(self.rng.randint(1, max(1, len(ending))), [f])
        return segments

    def go(self) -> dict:
        import docker

        self.docker = docker.from_env()
        pending_damage: list[str] = []
        for segment in self.plan():
            damage = [f for f in segment if f in BETWEEN]
            live = [f for f in segment if f not in BETWEEN]
            pending_damage += damage
            if not live:
                continue
            if self.alive():  # (a fault that should have ended it did not)
                self.kill(signal.SIGKILL)
            if self.proc is not None:
                self.segment_ended(self.wait_exit(30))
            if (self.run / "journal.jsonl").exists():  # damage only what a run wrote
                for d in pending_damage:
                    self.damage_files(d)
                pending_damage = []
            if self.run_finished():
                for f in live:
                    self.not_reached[f] += 1
                continue
            self.start({f for f in live if f in IN_PROCESS})
            for f in live:
                self.inject(f)
        for d in pending_damage:
            if not self.alive():
                self.damage_files(d)
        # then let the run finish, resuming as often as it takes
        while not self.run_finished():
            if not self.alive():
                self.segment_ended(self.proc.returncode if self.proc else None)
                self.start(set())
            code = self.wait_exit(self.args.finish_timeout)
            if code is None:
                raise SystemExit("chaos: the run did not finish in time")
            if code not in (0, 130) and not self.run_finished():
                raise SystemExit(f"chaos: a resume failed (exit {code}); see {self.work}")
        self.final_exit = self.wait_exit(self.args.finish_timeout)  # the end is journalled
        self.segment_ended(self.final_exit)
        return self.verdict()

    def run_finished(self) -> bool:
        ev = self.events() if (self.run / "journal.jsonl").exists() else []
        version = sum(e["e"] == "commit" for e in ev)
        return version >= self.args.updates and any(e["e"] == "end" for e in ev)

    # -- what was lost ----------------------------------------------------------------------
    def verdict(self) -> dict:
        import pandas as pd

        commits = self.commits()
        versions = [c["version"] for c in commits]
        counts = Counter(versions)
        want = range(1, self.args.updates + 1)
        lost_by: Counter = Counter()
        for kind, before in self.snapshots:
            final = {c["version"]: c for c in commits}
            lost_by[kind] += sum(final.get(c["version"]) != c for c in before)
        twice = sum(n - 1 for n in counts.values() if n > 1)
        ups = pd.read_parquet(self.run / "updates.parquet")["version"].tolist()
        skipped = sum(v not in counts for v in want) + sum(v not in ups for v in want)
        repeated = twice + (len(ups) - len(set(ups)))
        ev = self.events()
        dispatched = {e["job"] for e in ev if e["e"] == "dispatch"}
        decided = {e["job"] for e in ev if e["e"] in ("result", "cancel")}
        jobs = pd.read_parquet(self.run / "jobs.parquet")
        no_verdict = len(dispatched - decided - set(jobs["job_id"])) + int(
            (jobs["verdict"].isna() | (jobs["reason"] == "never finished")).sum()
        )
        ckpt = json.loads((self.run / "checkpoint" / "es_checkpoint.json").read_text())
        log_ok = ckpt["log"] == [c["record"] for c in commits]
        bad_lines = 0
        for line in (self.run / "transcripts.jsonl").read_text().splitlines():
            try:
                json.loads(line)
            except json.JSONDecodeError:
                bad_lines += 1
        time.sleep(2)  # containers being removed at exit
        left = self.sandboxes(running_only=False)
        from runner.terminal.reaper import LABEL_OWNER

        ours = [
            c
            for c in self.docker.api.containers(all=True, filters={"label": LABEL_OWNER})
            if json.loads(c["Labels"][LABEL_OWNER]).get("pid")
            in set(self.pids) | set(self.actor_pids())
        ]
        procs_left = [p for p in self.pids + self.actor_pids() if _alive(p)]
        final_hash = None
        for line in self.log_path.read_text().splitlines():
            final_hash = json.loads(line).get("final_hash", final_hash)
        rebuilt = export_hash(self.run, self.work / "export")
        tmp_left = sorted(p.name for p in self.run.rglob("*.tmp"))
        # a process stopped by a fault says why in a line: one that failed and whose log ends
        # in a traceback did not (a worker's crash logged with its traceback is no failure)
        tracebacks = [
            name
            for name, code in self.segment_codes.items()
            if code not in (0, 130, -signal.SIGKILL)
            and "Traceback" in "\n".join((self.work / name).read_text().splitlines()[-40:])
        ]
        return {
            "seed": self.args.seed,
            "updates": self.args.updates,
            "restarts": self.restarts,
            "injected": dict(self.injected),
            "survived": dict(self.survived),
            "needed_resume": dict(self.resumed),
            "not_reached": dict(self.not_reached),
            "lost_by_fault": dict(lost_by),
            "updates_lost": sum(lost_by.values()),
            "updates_applied_twice": twice,
            "versions_skipped": skipped,
            "versions_repeated": repeated,
            "jobs_without_verdict": no_verdict,
            "checkpoint_log_equals_journal": log_ok,
            "transcript_lines_damaged": bad_lines,
            "containers_left": len({c["Id"] for c in left + ours}),
            "processes_left": len(procs_left),
            "temporary_files_left": tmp_left,
            "tracebacks": tracebacks,
            "nonzero_updates": sum(
                any(coef != 0.0 for _, coef in c["record"]["entries"]) for c in commits
            ),
            "final_weights_hash": final_hash,
            "rebuilt_weights_hash": rebuilt,
            "hashes_equal": final_hash is not None and final_hash == rebuilt,
            "sigint_sigterm_exit_codes": self.exit_codes,
            "final_exit_code": self.final_exit,
            "disk_full_exit_codes": self.disk_full_exits,
            "work": str(self.work),
        }


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def _descendants(root: int) -> set[int]:
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    parent[int(entry)] = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier} - found
        found |= frontier
    return found


def export_hash(run: Path, out: Path) -> str | None:
    """The weights rebuilt from the update log by a fresh process (es-runner model export)."""
    done = subprocess.run(
        [sys.executable, "-m", "runner.cli", "model", "export", str(run), str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=600,
    )
    if done.returncode != 0:
        print(done.stderr[-2000:], file=sys.stderr)
        return None
    return json.loads((out / "export.json").read_text())["weights_sha256"]


def engine_restart(down_s: float) -> None:
    """Stop the Docker engine (its pid file) and start it again (scripts/setup_docker.sh)."""
    pid = int(Path("/var/run/docker.pid").read_text().strip())
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(down_s)
    subprocess.run(["bash", str(REPO / "scripts" / "setup_docker.sh")], check=True, timeout=300)


def format_table(v: dict) -> str:
    kinds = sorted(set(v["injected"]) | set(v["not_reached"]))
    rows = [
        f"{'fault':<22} {'injected':>8} {'survived':>8} {'--resume':>8} {'lost':>5} {'not reached':>11}"
    ]
    for k in kinds:
        rows.append(
            f"{k:<22} {v['injected'].get(k, 0):>8} {v['survived'].get(k, 0):>8} "
            f"{v['needed_resume'].get(k, 0):>8} {v['lost_by_fault'].get(k, 0):>5} "
            f"{v['not_reached'].get(k, 0):>11}"
        )
    sigkills = sum(n for k, n in v["injected"].items() if k.startswith("sigkill"))
    rows += [
        "",
        f"SIGKILLs: {sigkills}; resumes: {v['restarts']}; seed {v['seed']}, {v['updates']} updates "
        f"({v['nonzero_updates']} nonzero)",
        f"committed updates lost: {v['updates_lost']}   applied twice: {v['updates_applied_twice']}",
        f"versions skipped: {v['versions_skipped']}   repeated: {v['versions_repeated']}",
        f"jobs without a verdict: {v['jobs_without_verdict']}",
        f"checkpoint log == journal commits: {v['checkpoint_log_equals_journal']}",
        f"damaged transcript lines: {v['transcript_lines_damaged']}",
        f"containers left behind: {v['containers_left']}   processes left behind: "
        f"{v['processes_left']}   temporary files left: {len(v['temporary_files_left'])}",
        f"processes that ended in a traceback: {len(v['tracebacks'])}",
        f"final weights {str(v['final_weights_hash'])[:16]} vs rebuilt from the update log "
        f"{str(v['rebuilt_weights_hash'])[:16]}: {'equal' if v['hashes_equal'] else 'DIFFERENT'}",
        f"SIGINT/SIGTERM exit codes: {v['sigint_sigterm_exit_codes']}; the last process: "
        f"{v['final_exit_code']}; disk full: {v['disk_full_exit_codes']}",
    ]
    return "\n".join(rows)


def write_config(args: argparse.Namespace, work: Path) -> Path:
    import yaml

    base = yaml.safe_load((REPO / "configs/runner/cpu_tiny.yaml").read_text())
    base["updates"] = args.updates
    base["model"]["path"] = str(args.model)
    base["eval_every"] = args.eval_every
    # graded fitness: a random model passes some of a task's checks now and then, so the
    # updates are not all zero and the weights-hash check compares real weights
    base["es"]["reward"] = "graded"
    base["tasks"] = {"generate": {"n": args.tasks, "seed": 0}, "split": "train"}
    if args.ray:
        base["backend"] = "ray"
    if args.short:
        base.update(cohort=2, episodes_per_job=2, concurrency=2, max_turns=2)
        base["sampling"]["max_new_tokens"] = 12
        base["eval"] = {"split": "test", "seeds": [42], "max_tasks": 2}
    path = work / "chaos.yaml"
    path.write_text(yaml.safe_dump(base))
    return path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--short", action="store_true", help="a few faults, for the tests")
    p.add_argument("--updates", type=int, help="updates of the run (long 12, short 2)")
    p.add_argument("--tasks", type=int, default=16, help="generated tasks")
    p.add_argument("--eval-every", type=int, help="evaluate every k versions (long 3, short 0)")
    p.add_argument("--model", type=Path, help="model folder (default: a tiny one, made here)")
    p.add_argument("--out", type=Path, help="work folder (default: a temporary one)")
    p.add_argument("--engine-restart", action="store_true", help="also stop and restart dockerd")
    p.add_argument("--engine-stop-s", type=float, default=5.0)
    p.add_argument("--disk-full", action="store_true", help="run on a small tmpfs (root)")
    p.add_argument("--ray", action="store_true", help="backend: ray, with its faults")
    p.add_argument("--disk-mb", type=int, default=64, help="the tmpfs's size")
    p.add_argument("--max-delay", type=float, default=8.0, help="seconds a fault may wait")
    p.add_argument("--hook-timeout", type=float, default=180.0)
    p.add_argument("--finish-timeout", type=float, default=1800.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    args.updates = args.updates or (2 if args.short else 12)
    args.eval_every = args.eval_every if args.eval_every is not None else (0 if args.short else 3)
    work = args.out or Path(tempfile.mkdtemp(prefix="chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.model is None:
        args.model = work / "tiny"
        if not args.model.exists():
            subprocess.run(
                [sys.executable, "-m", "runner.cli", "model", "make-tiny", str(args.model)],
                cwd=REPO,
                check=True,
                capture_output=True,
                env={**os.environ, "PYTHONPATH": str(REPO)},
            )
    args.config_path = write_config(args, work)
    chaos = Chaos(args, work)
    if args.disk_full:  # the run directory on a filesystem of its own that can fill up
        chaos.run = work / "disk" / "run"
        chaos.run.parent.mkdir(exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={args.disk_mb}m", "tmpfs", str(chaos.run.parent)],
            check=True,
        )
    try:
        verdict = chaos.go()
    finally:
        if args.disk_full:
            subprocess.run(["umount", "-l", str(chaos.run.parent)], check=False)
    print(json.dumps(verdict) if args.json else format_table(verdict))
    return 0


if __name__ == "__main__":
    sys.exit(main())
