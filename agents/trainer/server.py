"""The trainer process: a GRPO trainer (or an emulated one) behind the trainer's data plane.

`python -m agents.trainer --port 0 --ckpt-dir D --weights-dir W` serves the trainer's data plane
(bearer token in env `PEARL_TRAINER_TOKEN`): POST /samples queues rollout samples and trains once a
batch is full; GET /weights/latest and /weights/{version} serve versioned safetensors snapshots that
workers pull. Every update is a new weight version. Staleness is checked per sample when it is
consumed (trainer version - sample version > max_staleness -> rejected and counted), which bounds
what a run-ahead bound alone does not. Checkpoints are safetensors written to a temp directory and
renamed, then a `latest` pointer is replaced atomically, so a kill at any point resumes from the
last complete step (losing at most the step in progress).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import secrets
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agents import dataplane as dp
from agents.crash import crash_point
from agents.process import die_with_parent, serve_until_signal, visible_devices
from agents.trainer.base import Trainer, UpdateStats
from agents.trainer.emulated import EmulatedTrainer
from agents.trainer.export import DEFAULT_SHARD_SIZE, Exporter
from agents.trainer.grpo import GRPOConfig, GRPOTrainer
from agents.weights import WeightStore, atomic_write
from controlplane.core.wire import ErrorReply, WireError


def _answer(message: Any) -> Any:
    """A data-plane answer (`dp.*`) as the trainer's JSON response."""
    from aiohttp import web

    return web.json_response(dp.DATA_PLANE.dump(message))


def _error(status: int, why: str) -> Any:
    from aiohttp import web

    return web.json_response(dp.DATA_PLANE.dump(ErrorReply(detail=why)), status=status)


class TrainerServer:
    """`token` is the trainer's own secret (its agent and the job's driver use it); weights are also
    served to holders of a scoped weights token of this trainer's job (`weights_key`, see agent_link)."""

    def __init__(
        self, trainer: Trainer, token: str, *, weights_key: str = "", rotate_s: float = 300.0, job_token: str = ""
    ) -> None:
        from aiohttp import web

        from agents.weights import weight_routes
        from controlplane.core.agent_link import verify_weights_token

        if not token:
            raise ValueError("a trainer token is required (fail closed)")
        self.trainer = trainer
        self.token = token
        self.job_token = job_token  # the job's rollout driver posts samples and steps with it

        def may_pull(presented: str) -> bool:
            return secrets.compare_digest(presented.encode(), token.encode()) or (
                bool(weights_key) and verify_weights_token(weights_key, trainer.job, presented, rotate_s)
            )

        self.queue: list[dp.TrainSample] = []
        self.buffer = StepBuffer(trainer.ckpt_dir)
        self._settle_audit()
        # a buffer its checkpoint says is trained outlived a crash between the update's commit and its drop
        for step in [s for s in self.buffer.steps if s in trainer.trained_steps]:
            self.buffer.drop_through(step)
        self.history: list[UpdateStats] = []
        self._lock = asyncio.Lock()

        @web.middleware
        async def auth(request: Any, handler: Any) -> Any:
            return await self._auth_mw(request, handler)

        app = web.Application(client_max_size=dp.MAX_TRAINER_REQUEST_BYTES, middlewares=[auth])
        app.router.add_post("/samples", self.samples)
        app.router.add_get("/samples", self.buffered)
        app.router.add_post("/step", self.step)
        app.router.add_get("/stats", self.stats)
        app.router.add_get("/health", self.health)
        if trainer.store is not None:
            app.add_subapp("/weights/", weight_routes(trainer.store, may_pull))
        self.app = app

    async def _auth_mw(self, request: Any, handler: Any) -> Any:

        if request.path.startswith("/weights/"):  # the weights sub-app checks the token itself
            return await handler(request)
        header = request.headers.get(dp.AUTH_HEADER, "")
        presented = header[7:].encode() if header.startswith("Bearer ") else b""
        ok = bool(presented) and (
            secrets.compare_digest(presented, self.token.encode())
            or (bool(self.job_token) and secrets.compare_digest(presented, self.job_token.encode()))
        )
        if not ok:
            return _error(401, "missing or bad trainer token")
        return await handler(request)

    async def samples(self, request: Any) -> Any:

        try:
            body = dp.DATA_PLANE.parse(dp.DATA_PLANE.decode(await request.read() or b"{}"), dp.SubmitSamples)
        except WireError as exc:
            return _error(400, str(exc))
        if self.trainer.trains_on_tokens and any(s.token_count for s in body.samples):
            return _error(
                400,
                "SubmitSamples.samples: this trainer trains on tokens; "
                "token_count-only samples are for the emulated trainer",
            )
        if body.step >= 0:  # the rollout driver's samples of finished trajectories, kept for that step
            # idempotent by trajectory: a re-post keeps the first durable copy; a step trained already takes none
            if body.step not in self.trainer.trained_steps:
                self.buffer.add(body.step, body.samples)
            return _answer(dp.SamplesKept(self.buffer.size(body.step), self.trainer.version))
        self.queue.extend(body.samples)
        stats = None
        if body.train and len(self.queue) >= self.trainer.batch_size:
            stats = await self._update_queued()
        return _answer(dp.SamplesQueued(len(self.queue), self.trainer.version, asdict(stats) if stats else None))

    async def buffered(self, request: Any) -> Any:
        """The finished trajectories held for the steps not trained yet (a restarted driver recovers them)."""
        out = [
            dp.BufferedTrajectory(step, tid, ss[0].reward, min(x.weight_version for x in ss), turns=len(ss))
            for step, trajs in sorted(self.buffer.steps.items())
            for tid, ss in trajs.items()
            if ss
        ]
        return _answer(dp.BufferedSamples(out, self.trainer.version))

    async def step(self, request: Any) -> Any:

        try:
            body = dp.DATA_PLANE.parse(dp.DATA_PLANE.decode(await request.read() or b"{}"), dp.StepRequest)
        except WireError as exc:
            return _error(400, str(exc))
        if body.step >= 0:
            try:
                return _answer(await self._update_step(body))
            except VersionConflict as exc:
                return _error(409, str(exc))
        stats = await self._update_queued(everything=body.all)
        return _answer(dp.QueuedUpdateAnswer(self.trainer.version, asdict(stats) if stats else None))

    async def _update_step(self, body: dp.StepRequest) -> dp.UpdateAnswer:
        """The update of rollout step `body.step`, exactly once, keyed by (step, the version it updates):
        asked again (a restarted driver), it answers with the version that update published; asked of a
        trainer at another version than the loop's (restored from an older checkpoint), it is refused
        (`VersionConflict`), so no version is published twice. The update commits with the trainer's
        checkpoint (`trained_steps` in it); the step's buffer is dropped only after, and the commit is
        written to the audit (`updates.jsonl`: which trajectories each committed update consumed)."""
        async with self._lock:
            t = self.trainer
            if body.step in t.trained_steps:
                return dp.UpdateAnswer(t.trained_steps[body.step], None, already=True)
            if body.version >= 0 and body.version != t.version:
                raise VersionConflict(
                    f"step {body.step} updates weights v{body.version}, but this trainer is at v{t.version}"
                )
            samples, missing = self.buffer.take(body.step, body.trajectories, body.dropped)
            consumed = list(dict.fromkeys(s.trajectory for s in samples))
            self._audit_ahead(body.step, consumed, missing)
            crash_point("trainer.mid_update")
            stats = await t.update(samples, body.step, body.training_gpus)
            crash_point("trainer.after_commit")
            self._audit(body.step, t.trained_steps[body.step], consumed, missing)
            self.buffer.drop_through(body.step)
            self.history.append(stats)
            return dp.UpdateAnswer(t.trained_steps[body.step], asdict(stats), missing=missing)

    def _audit(self, step: int, version: int, trajectories: list[str], missing: list[str]) -> None:
        """One line per committed update: the step, the version it published, the trajectories it consumed;
        then the line written ahead of the commit (`_audit_ahead`) is done with."""
        ckpt = self.trainer.ckpt_dir
        if ckpt is None:
            return
        line = {"step": step, "version": version, "trajectories": trajectories, "missing": missing}
        with open(Path(ckpt) / "updates.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")
            f.flush()
            os.fsync(f.fileno())
        (Path(ckpt) / "updates.pending").unlink(missing_ok=True)

    def _audit_ahead(self, step: int, trajectories: list[str], missing: list[str]) -> None:
        """The update's audit line, durable before its commit (`<ckpt>/updates.pending`): a crash between the
        commit and the line (found by the crash suite: that update went missing from the audit, and the
        driver's retry is answered `already`) leaves it for the restarted trainer (`_settle_audit`)."""
        ckpt = self.trainer.ckpt_dir
        if ckpt is not None:
            line = {"step": step, "trajectories": trajectories, "missing": missing}
            atomic_write(Path(ckpt) / "updates.pending", json.dumps(line).encode())

    def _settle_audit(self) -> None:
        """At start: the line written ahead of an update is appended if its update committed (the checkpoint's
        `trained_steps` has the step) and the audit lacks it; else the update never committed and it goes."""
        ckpt = self.trainer.ckpt_dir
        pending = Path(ckpt) / "updates.pending" if ckpt is not None else None
        if pending is None or not pending.exists():
            return
        try:
            line = json.loads(pending.read_text())
            step = int(line["step"])
        except (ValueError, KeyError, TypeError):
            pending.unlink(missing_ok=True)
            return
        audit = pending.with_name("updates.jsonl")
        done: set[int] = set()
        for x in audit.read_text().splitlines() if audit.exists() else []:
            with contextlib.suppress(ValueError, KeyError, TypeError):  # a torn last line is no update's
                done.add(int(json.loads(x)["step"]))
        if step in self.trainer.trained_steps and step not in done:
            self._audit(step, self.trainer.trained_steps[step], list(line["trajectories"]), list(line["missing"]))
        pending.unlink(missing_ok=True)

    async def _update_queued(self, everything: bool = False) -> UpdateStats | None:
        async with self._lock:
            n = len(self.queue) if everything else self.trainer.batch_size
            batch, self.queue = self.queue[:n], self.queue[n:]
            if not batch:
                return None
            stats = await self.trainer.update(batch)
            self.history.append(stats)
            return stats

    async def stats(self, request: Any) -> Any:

        t = self.trainer
        last = asdict(self.history[-1]) if self.history else None
        return _answer(dp.TrainerStats(t.version, t.steps, t.stale_rejected, t.consumed, len(self.queue), last))

    async def health(self, request: Any) -> Any:
        return _answer(dp.Health(True, 0, "training", "running", self.trainer.version, os.getpid(), visible_devices()))


class VersionConflict(Exception):
    """A rollout step's update asked of a trainer at another weight version than the loop's (-> 409)."""


class StepBuffer:
    """Samples of finished trajectories, per rollout step, until that step's update. On disk (JSON lines,
    one file per step) when the trainer has a checkpoint directory: neither a driver nor a trainer
    restart loses a trajectory the loop counted as finished (the driver posts before it counts)."""

    def __init__(self, ckpt_dir: Path | None) -> None:
        self.dir = Path(ckpt_dir) / "buffer" if ckpt_dir else None
        self.steps: dict[int, dict[str, list[dp.TrainSample]]] = {}
        if self.dir is not None and self.dir.exists():
            for f in sorted(self.dir.glob("step_*.jsonl")):
                step = int(f.stem.split("_")[1])
                for line in f.read_text().splitlines():
                    with contextlib.suppress(ValueError):  # a torn last line (or WireError): that post is resent
                        rec = dp.DATA_PLANE.decode(line)
                        self.steps.setdefault(step, {}).setdefault(  # the first copy, as `add` keeps
                            rec["trajectory"], [dp.DATA_PLANE.parse(x, dp.TrainSample) for x in rec["samples"]]
                        )

    def add(self, step: int, samples: list[dp.TrainSample]) -> None:
        """Keep (durably, before the answer) the samples of trajectories not held yet; a trajectory held
        already keeps its first copy (the one a driver may have counted): a re-post changes nothing."""
        have = self.steps.setdefault(step, {})
        by_traj: dict[str, list[dp.TrainSample]] = {}
        for s in samples:
            if s.trajectory not in have:
                by_traj.setdefault(s.trajectory, []).append(s)
        if not by_traj:
            return
        have.update(by_traj)
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
            with open(self.dir / f"step_{step:08d}.jsonl", "a") as f:
                for t, ss in by_traj.items():
                    f.write(json.dumps({"trajectory": t, "samples": [dp.DATA_PLANE.dump(x) for x in ss]}) + "\n")
                f.flush()
                os.fsync(f.fileno())

    def size(self, step: int) -> int:
        return len(self.steps.get(step, {}))

    def take(
        self, step: int, trajectories: list[str], dropped: Sequence[str] = ()
    ) -> tuple[list[dp.TrainSample], list[str]]:
        """The samples of `trajectories` (none named: every buffered one but `dropped`) and the names missing."""
        have = self.steps.get(step, {})
        out = set(dropped)
        wanted = trajectories or [t for t in have if t not in out]
        return [s for t in wanted for s in have.get(t, [])], [t for t in wanted if t not in have]

    def drop_through(self, step: int) -> None:
        for k in [k for k in self.steps if k <= step]:
            del self.steps[k]
        if self.dir is not None:
            for f in self.dir.glob("step_*.jsonl"):
                if int(f.stem.split("_")[1]) <= step:
                    f.unlink(missing_ok=True)


async def serve(args: argparse.Namespace, token: str) -> None:

    cfg = GRPOConfig(lr=args.lr, kl_beta=args.kl_beta, max_staleness=args.max_staleness, batch_size=args.batch_size)
    store = WeightStore(Path(args.weights_dir))
    trainer: Trainer
    if (args.engine == "emulated" and args.model != "tiny") or args.emulated:
        trainer = EmulatedTrainer(
            model=args.model,
            hardware=args.hardware or "H800",
            tp=int(args.tp or 1),
            time_factor=float(args.time_factor or 1.0),
            store=store,
            ckpt_dir=Path(args.ckpt_dir) if args.ckpt_dir else None,
            job=args.job or "",
            batch_size=args.batch_size,
        )
    else:
        exporter = None
        try:
            exporter = (
                Exporter(
                    Path(args.export_dir),
                    every=args.export_every,
                    keep=args.export_keep,
                    model_spec=args.model,
                    job=args.job or "",
                    max_shard_size=os.environ.get("PEARL_EXPORT_SHARD_SIZE") or DEFAULT_SHARD_SIZE,
                )
                if args.export_dir
                else None
            )
        except OSError:  # a directory it may not write: it trains without exporting (logged), never fails to start
            logging.getLogger(__name__).exception("no Hugging Face checkpoints: %s is not writable", args.export_dir)
        trainer = GRPOTrainer(
            args.model,
            cfg,
            ckpt_dir=Path(args.ckpt_dir) if args.ckpt_dir else None,
            store=store,
            threads=args.threads,
            job=args.job or "",
            init_from=args.init_from,
            exporter=exporter,
        )
    server = TrainerServer(
        trainer,
        token,
        weights_key=os.environ.get("PEARL_WEIGHTS_KEY", ""),
        rotate_s=float(os.environ.get("PEARL_WEIGHTS_ROTATE_S", "300")),
        job_token=os.environ.get("PEARL_JOB_TOKEN", ""),
    )
    runner, port, stop = await serve_until_signal(server.app, args.host, args.port)
    print(
        "PEARL_WORKER_READY " + json.dumps({"port": port, "pid": os.getpid(), "version": trainer.version}), flush=True
    )
    await stop.wait()
    async with server._lock:  # let a running step finish (its checkpoint is atomic anyway)
        if isinstance(trainer, GRPOTrainer) and trainer.exporter is not None:  # the checkpoint at stop (issue 36)
            try:
                await asyncio.get_running_loop().run_in_executor(None, trainer.export)
            except Exception:  # a failed export never hides the process's exit (the last periodic one stands)
                logging.getLogger(__name__).exception("the checkpoint at stop failed")
    await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m agents.trainer", description=__doc__)
    p.add_argument("--model", default="tiny")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--weights-dir", required=True)
    p.add_argument("--ckpt-dir", default="")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--kl-beta", type=float, default=0.0)
    p.add_argument("--max-staleness", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=None)
    # Hugging Face checkpoints the user takes home (issue 36): where, every how many updates, how many kept
    p.add_argument("--export-dir", default="")
    p.add_argument("--export-every", type=int, default=10)
    p.add_argument("--export-keep", type=int, default=3)
    p.add_argument("--init-from", default="", help="a checkpoint directory the policy starts from")
    # accepted so the agent can spawn a trainer like any worker
    p.add_argument("--emulated", action="store_true", help="time updates by the profile instead of training")
    for extra in ("--role", "--worker-id", "--engine", "--job", "--hardware", "--time-factor", "--state-dir", "--tp"):
        p.add_argument(extra, default=None)
    args = p.parse_args(argv)
    token = os.environ.get("PEARL_WORKER_SECRET") or os.environ.get("PEARL_TRAINER_TOKEN", "")
    if not token:
        sys.exit("PEARL_TRAINER_TOKEN is not set: refusing to serve without auth")
    # any --host (the agent's bind address when drivers on other hosts call it): every call needs the token
    die_with_parent()
    asyncio.run(serve(args, token))
