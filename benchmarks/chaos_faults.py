"""The driver of a chaos run (benchmarks/chaos.py): starts the trainer, injects the faults
at seeded random moments, resumes it after each kill, and counts from the run's files what
it survived and what it lost."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
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
            [sys.executable, str(HERE / "chaos.py"), "--child", "train", *args, "--no-progress"],
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
