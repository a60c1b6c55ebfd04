"""The trainer with chaos's in-process fault points: ``python benchmarks/chaos.py --child
ARGS`` runs ``es-runner ARGS`` with each fault named in $CHAOS_HOOKS armed (benchmarks/chaos.py
says what each one does). It wraps the functions concerned; nothing of the runner changes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path


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
