"""GRPO trainer: group-normalised advantages, clipped ratio loss, optional KL to a reference.

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
import concurrent.futures
import contextlib
import json
import os
import secrets
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import load_file, save_file

from agents import dataplane as dp
from agents.process import die_with_parent, serve_until_signal, visible_devices
from agents import models
from agents.weights import WeightStore, atomic_write


@dataclass
class GRPOConfig:
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    clip_eps: float = 0.2
    kl_beta: float = 0.0  # > 0 adds KL(pi || pi_ref) (k3 estimator) to a frozen reference
    max_grad_norm: float = 1.0
    max_staleness: int = 1  # K: samples more than K versions behind the trainer are rejected
    batch_size: int = 32  # samples per step (HTTP mode)
    seed: int = 0


@dataclass
class StepStats:
    version: int
    loss: float
    grad_norm: float
    mean_reward: float
    accepted: int
    rejected_stale: int
    kl: float = 0.0
    duration_s: float = 0.0


class Trainer(Protocol):
    """What the trainer server needs of a trainer: GRPO (`GRPOTrainer`, trains the model on its tokens) and
    emulated (`EmulatedTrainer`, takes a profile's update time for the samples' token counts) alike."""

    job: str
    version: int  # the weight version of the latest update (each update publishes the next one)
    steps: int  # updates done
    stale_rejected: int
    consumed: int
    trained_steps: dict[int, int]  # rollout step -> the version its update published
    trains_on_tokens: bool  # False: samples may carry a token_count instead of their tokens

    @property
    def store(self) -> WeightStore | None:
        """Where its updates are published (workers pull them from the server's /weights/)."""
        ...

    @property
    def ckpt_dir(self) -> Path | None:
        """Its checkpoints (the server keeps its per-step sample buffer there too)."""
        ...

    @property
    def batch_size(self) -> int:
        """Samples per update on the queue path (`POST /samples` without a rollout step)."""
        ...

    async def update(self, samples: list[dp.TrainSample], rollout_step: int | None = None,
                     training_gpus: int = 1) -> StepStats:
        """One update on `samples`. With `rollout_step`, the update of that step of the RL loop (recorded
        in `trained_steps`); `training_gpus` is what an emulated update is timed on."""
        ...


def group_advantages(rewards: list[float], groups: list[str], trajectories: list[str] | None = None) -> torch.Tensor:
    """A_i = (r_i - mean_g) / (std_g + eps) within each group (GRPO). With `trajectories`, the
    statistics are over the group's trajectories (one reward each), and every turn of a multi-turn
    trajectory gets its trajectory's advantage: a trajectory with more turns does not weigh more."""
    r = torch.tensor(rewards, dtype=torch.float32)
    adv = torch.zeros_like(r)
    keys = [f"{g}\x00{t}" if t else f"{g}\x00#{i}" for i, (g, t) in
            enumerate(zip(groups, trajectories or [""] * len(groups)))]
    for g in set(groups):
        idx = [i for i, x in enumerate(groups) if x == g]
        first: dict[str, int] = {}
        for i in idx:
            first.setdefault(keys[i], i)
        rg = r[torch.tensor(list(first.values()))]
        std = rg.std(unbiased=False) if len(rg) > 1 else torch.tensor(0.0)
        mean = rg.mean()
        for i in idx:
            adv[i] = (r[first[keys[i]]] - mean) / (std + 1e-6)
    return adv


class GRPOTrainer:
    """The real trainer: GRPO on a torch model; its updates run on one thread of their own."""

    trains_on_tokens = True

    def __init__(self, model: str = "tiny", config: GRPOConfig | None = None, *, ckpt_dir: Path | None = None,
                 store: WeightStore | None = None, threads: int | None = None, job: str = "") -> None:
        self.config = config or GRPOConfig()
        models.set_threads(threads)
        torch.manual_seed(self.config.seed)
        self.model = models.load_model(model)
        self.model.train()
        self.ref = models.load_model(model) if self.config.kl_beta > 0 else None
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=self.config.lr, betas=self.config.betas, weight_decay=self.config.weight_decay)
        self.version = 0
        self.steps = 0
        self.stale_rejected = 0
        self.consumed = 0
        self.trained_steps: dict[int, int] = {}  # rollout step -> the version its update published
        self.job = job
        self.ckpt_dir = Path(ckpt_dir) if ckpt_dir else None
        self.store = store
        if self.ckpt_dir:
            self.resume()
        if self.store:
            self._reconcile_store()
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="trainer")

    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    async def update(self, samples: list[dp.TrainSample], rollout_step: int | None = None,
                     training_gpus: int = 1) -> StepStats:
        """`step` on the trainer's own thread: the server's event loop keeps answering meanwhile."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, self.step, samples, rollout_step)

    def _reconcile_store(self) -> None:
        """After a (re)start: the store holds exactly what workers may have pulled. Publish the current
        version if the store lacks it (first start: version 0, the initial weights; or a kill between
        checkpoint and publish); if the store is ahead of the checkpoint, continue from its snapshot."""
        assert self.store is not None
        versions = self.store.versions()
        if not versions or versions[-1] < self.version:
            self.publish()
        elif versions[-1] > self.version:
            from safetensors.torch import load as st_load

            models.load_wire_state(self.model, st_load(self.store.read(versions[-1])))
            self.version = versions[-1]

    # ---- staleness
    def admit(self, samples: list[dp.TrainSample]) -> list[dp.TrainSample]:
        """Per-sample staleness at consumption (not at generation): reject and count the stale ones."""
        fresh = [s for s in samples if self.version - s.weight_version <= self.config.max_staleness]
        self.stale_rejected += len(samples) - len(fresh)
        return fresh

    # ---- one GRPO update
    def step(self, samples: list[dp.TrainSample], rollout_step: int | None = None) -> StepStats:
        """One GRPO update. With `rollout_step`, the update of that step of the RL loop: it publishes a
        new version even if no sample survives the staleness check (one version per step)."""
        t0 = time.perf_counter()
        fresh = self.admit(samples)
        rejected = len(samples) - len(fresh)
        if not fresh:
            if rollout_step is not None:
                self._advance(rollout_step)
            return StepStats(self.version, 0.0, 0.0, 0.0, 0, rejected)
        adv = group_advantages([s.reward for s in fresh], [s.group for s in fresh], [s.trajectory for s in fresh])
        seqs = [s.prompt_tokens + s.completion_tokens for s in fresh]
        width = max(len(x) for x in seqs)
        ids = torch.full((len(seqs), width), 258, dtype=torch.long)
        attn = torch.zeros((len(seqs), width), dtype=torch.long)
        comp_mask = torch.zeros((len(seqs), width - 1))
        old = torch.zeros((len(seqs), width - 1))
        temps = torch.tensor([s.temperature for s in fresh]).view(-1, 1, 1)
        for i, s in enumerate(fresh):
            n, p = len(seqs[i]), len(s.prompt_tokens)
            ids[i, :n] = torch.tensor(seqs[i])
            attn[i, :n] = 1
            # position t predicts token t+1: completion token j sits at index p+j, predicted at p+j-1
            comp_mask[i, p - 1 : n - 1] = 1
            old[i, p - 1 : n - 1] = torch.tensor(s.logprobs)
        targets = ids[:, 1:]
        logits = self.model(input_ids=ids, attention_mask=attn).logits[:, :-1]
        logp = torch.log_softmax(logits / temps, dim=-1).gather(2, targets.unsqueeze(2)).squeeze(2)
        ratio = torch.exp(logp - old)
        a = adv.view(-1, 1)
        eps = self.config.clip_eps
        per_tok = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - eps, 1 + eps) * a)
        kl_val = torch.tensor(0.0)
        if self.ref is not None:
            with torch.no_grad():
                ref_logits = self.ref(input_ids=ids, attention_mask=attn).logits[:, :-1]
                ref_logp = torch.log_softmax(ref_logits / temps, dim=-1).gather(2, targets.unsqueeze(2)).squeeze(2)
            d = ref_logp - logp
            kl_tok = torch.exp(d) - d - 1
            per_tok = per_tok + self.config.kl_beta * kl_tok
            kl_val = (kl_tok * comp_mask).sum() / comp_mask.sum()
        # GRPO: mean over each sequence's completion tokens, then over the batch
        loss = ((per_tok * comp_mask).sum(1) / comp_mask.sum(1)).mean()
        self.optim.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm))
        self.optim.step()
        self.consumed += len(fresh)
        self._advance(rollout_step)
        return StepStats(self.version, float(loss.detach()), grad_norm, sum(s.reward for s in fresh) / len(fresh), len(fresh),
                         rejected, float(kl_val.detach()), time.perf_counter() - t0)

    def _advance(self, rollout_step: int | None) -> None:
        self.steps += 1
        self.version += 1
        if rollout_step is not None:
            self.trained_steps[rollout_step] = self.version
        if self.ckpt_dir:  # checkpoint first: a published version always has a checkpoint to resume from
            self.save_checkpoint()
        if self.store:
            self.publish()

    # ---- weights
    def wire_state(self) -> dict[str, torch.Tensor]:
        return models.state_dict_for_wire(self.model)

    def publish(self) -> Path:
        assert self.store is not None
        return self.store.publish(self.version, self.wire_state())

    # ---- checkpoints
    def save_checkpoint(self) -> Path:
        assert self.ckpt_dir is not None
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        name = f"step_{self.version:08d}"
        final = self.ckpt_dir / name
        tmp = self.ckpt_dir / f".{name}.{secrets.token_hex(4)}.tmp"
        tmp.mkdir()
        save_file(self.wire_state(), str(tmp / "model.safetensors"))
        opt_tensors: dict[str, torch.Tensor] = {"rng": torch.get_rng_state()}
        index = {id(p): i for i, p in enumerate(self.model.parameters())}
        for p, st in self.optim.state.items():
            for k, v in st.items():
                opt_tensors[f"state.{index[id(p)]}.{k}"] = v.detach().clone() if torch.is_tensor(v) else torch.tensor(v)
        save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.optim.param_groups]
        meta = {"job": self.job, "version": self.version, "steps": self.steps, "stale_rejected": self.stale_rejected,
                "consumed": self.consumed, "param_groups": groups, "config": asdict(self.config),
                "trained_steps": {str(k): v for k, v in self.trained_steps.items()}}
        (tmp / "trainer.json").write_text(json.dumps(meta))
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        atomic_write(self.ckpt_dir / "latest", name.encode())
        for old in sorted(p for p in self.ckpt_dir.glob("step_*") if p.name != name)[:-2]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def resume(self) -> bool:
        """Load the checkpoint `latest` points at; False if there is none."""
        assert self.ckpt_dir is not None
        pointer = self.ckpt_dir / "latest"
        if not pointer.exists():
            return False
        path = self.ckpt_dir / pointer.read_text().strip()
        meta = json.loads((path / "trainer.json").read_text())
        if meta.get("job", "") != self.job:  # another job's checkpoint (a reused directory): never resume from it
            return False
        models.load_wire_state(self.model, load_file(str(path / "model.safetensors")))
        opt = load_file(str(path / "optimizer.safetensors"))
        torch.set_rng_state(opt.pop("rng"))
        state: dict[int, dict[str, Any]] = {}
        for key, v in opt.items():
            _, idx, name = key.split(".", 2)
            state.setdefault(int(idx), {})[name] = v
        groups = meta["param_groups"]
        n = len(list(self.model.parameters()))
        groups[0]["params"] = list(range(n))  # one param group
        for g in groups:
            if "betas" in g:
                g["betas"] = tuple(g["betas"])
        self.optim.load_state_dict({"state": state, "param_groups": groups})
        self.version, self.steps = meta["version"], meta["steps"]
        self.stale_rejected, self.consumed = meta["stale_rejected"], meta["consumed"]
        self.trained_steps = {int(k): int(v) for k, v in meta.get("trained_steps", {}).items()}
        return True


# ------------------------------------------------------------------ HTTP service
class TrainerServer:
    """`token` is the trainer's own secret (its agent and the job's driver use it); weights are also
    served to holders of a scoped weights token of this trainer's job (`weights_key`, see agent_link)."""

    def __init__(self, trainer: Trainer, token: str, *, weights_key: str = "",
                 rotate_s: float = 300.0, job_token: str = "") -> None:
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
                bool(weights_key) and verify_weights_token(weights_key, trainer.job, presented, rotate_s))

        self.queue: list[dp.TrainSample] = []
        self.buffer = StepBuffer(trainer.ckpt_dir)
        self.history: list[StepStats] = []
        self._lock = asyncio.Lock()
        @web.middleware
        async def auth(request: Any, handler: Any) -> Any:
            return await self._auth_mw(request, handler)

        app = web.Application(client_max_size=64 << 20, middlewares=[auth])
        app.router.add_post("/samples", self.samples)
        app.router.add_post("/step", self.step)
        app.router.add_get("/stats", self.stats)
        app.router.add_get("/health", self.health)
        if trainer.store is not None:
            app.add_subapp("/weights/", weight_routes(trainer.store, may_pull))
        self.app = app

    async def _auth_mw(self, request: Any, handler: Any) -> Any:
        from aiohttp import web

        if request.path.startswith("/weights/"):  # the weights sub-app checks the token itself
            return await handler(request)
        header = request.headers.get(dp.AUTH_HEADER, "")
        presented = header[7:].encode() if header.startswith("Bearer ") else b""
        ok = bool(presented) and (secrets.compare_digest(presented, self.token.encode()) or
                                  (bool(self.job_token) and secrets.compare_digest(presented, self.job_token.encode())))
        if not ok:
            return web.json_response({"error": "missing or bad trainer token"}, status=401)
        return await handler(request)

    async def samples(self, request: Any) -> Any:
        from aiohttp import web

        try:
            body = dp.parse(dp.SubmitSamples, json.loads(await request.read() or b"{}"))
        except (ValueError, dp.DataPlaneError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        if self.trainer.trains_on_tokens and any(s.token_count for s in body.samples):
            return web.json_response({"error": "SubmitSamples.samples: this trainer trains on tokens; "
                                               "token_count-only samples are for the emulated trainer"}, status=400)
        if body.step >= 0:  # the rollout driver's samples of finished trajectories, kept for that step
            self.buffer.add(body.step, body.samples)
            return web.json_response({"buffered": self.buffer.size(body.step), "version": self.trainer.version})
        self.queue.extend(body.samples)
        stats = None
        if body.train and len(self.queue) >= self.trainer.batch_size:
            stats = await self._train()
        return web.json_response({"queued": len(self.queue), "version": self.trainer.version,
                                  "step": asdict(stats) if stats else None})

    async def step(self, request: Any) -> Any:
        from aiohttp import web

        try:
            body = dp.parse(dp.StepRequest, json.loads(await request.read() or b"{}"))
        except (ValueError, dp.DataPlaneError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        if body.step >= 0:
            return web.json_response(await self._train_step(body))
        stats = await self._train(everything=body.all)
        return web.json_response({"version": self.trainer.version, "step": asdict(stats) if stats else None})

    async def _train_step(self, body: dp.StepRequest) -> dict[str, Any]:
        """The update of rollout step `body.step`, exactly once: asked again (a restarted driver), it
        answers with the version that update published."""
        async with self._lock:
            t = self.trainer
            if body.step in t.trained_steps:
                return {"version": t.trained_steps[body.step], "step": None, "already": True, "missing": []}
            samples, missing = self.buffer.take(body.step, body.trajectories)
            stats = await t.update(samples, body.step, body.training_gpus)
            self.buffer.drop_through(body.step)
            self.history.append(stats)
            return {"version": t.trained_steps[body.step], "step": asdict(stats), "already": False, "missing": missing}

    async def _train(self, everything: bool = False) -> StepStats | None:
        async with self._lock:
            n = len(self.queue) if everything else self.trainer.batch_size
            batch, self.queue = self.queue[:n], self.queue[n:]
            if not batch:
                return None
            stats = await self.trainer.update(batch)
            self.history.append(stats)
            return stats

    async def stats(self, request: Any) -> Any:
        from aiohttp import web

        t = self.trainer
        return web.json_response({"version": t.version, "steps": t.steps, "stale_rejected": t.stale_rejected,
                                  "consumed": t.consumed, "queued": len(self.queue),
                                  "last": asdict(self.history[-1]) if self.history else None})

    async def health(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"ok": True, "role": "training", "state": "running", "worker_id": 0,
                                  "weight_version": self.trainer.version, "pid": os.getpid(), "devices": visible_devices()})


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
                    with contextlib.suppress(ValueError, dp.DataPlaneError):  # a torn last line: that post is resent
                        rec = json.loads(line)
                        self.steps.setdefault(step, {})[rec["trajectory"]] = [dp.parse(dp.TrainSample, x) for x in rec["samples"]]

    def add(self, step: int, samples: list[dp.TrainSample]) -> None:
        by_traj: dict[str, list[dp.TrainSample]] = {}
        for s in samples:
            by_traj.setdefault(s.trajectory, []).append(s)
        self.steps.setdefault(step, {}).update(by_traj)  # a re-post of a trajectory replaces it
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
            with open(self.dir / f"step_{step:08d}.jsonl", "a") as f:
                for t, ss in by_traj.items():
                    f.write(json.dumps({"trajectory": t, "samples": [dp.dump(x) for x in ss]}) + "\n")
                f.flush()
                os.fsync(f.fileno())

    def size(self, step: int) -> int:
        return len(self.steps.get(step, {}))

    def take(self, step: int, trajectories: list[str]) -> tuple[list[dp.TrainSample], list[str]]:
        have = self.steps.get(step, {})
        wanted = trajectories or list(have)
        return [s for t in wanted for s in have.get(t, [])], [t for t in wanted if t not in have]

    def drop_through(self, step: int) -> None:
        for k in [k for k in self.steps if k <= step]:
            del self.steps[k]
        if self.dir is not None:
            for f in self.dir.glob("step_*.jsonl"):
                if int(f.stem.split("_")[1]) <= step:
                    f.unlink(missing_ok=True)


class EmulatedTrainer:
    """A trainer for models this machine cannot train (Qwen3-8B, Qwen3-30B-A3B on logical CPU slots):
    an update takes the profile's training-step time for the batch's tokens on the job's training GPUs
    (`Profile.train_step_s`, FSDP2-like, PROFILES.md), scaled by the run's time factor; each update
    publishes a new (placeholder) weight version that emulated workers pull and time like real weights."""

    trains_on_tokens = False

    def __init__(self, *, model: str, hardware: str, tp: int, time_factor: float, store: WeightStore,
                 ckpt_dir: Path | None, job: str = "", batch_size: int = GRPOConfig.batch_size) -> None:
        from controlplane.core.profiles import get_profile

        self.profile = get_profile(hardware, model, tp=max(1, tp))
        self.time_factor = time_factor
        self.store: WeightStore = store
        self.batch_size = batch_size
        self.ckpt_dir = ckpt_dir
        self.job = job
        self.version = self.steps = self.stale_rejected = self.consumed = 0
        self.trained_steps: dict[int, int] = {}
        if ckpt_dir is not None and (ckpt_dir / "emulated.json").exists():
            meta = json.loads((ckpt_dir / "emulated.json").read_text())
            self.version, self.steps, self.consumed = meta["version"], meta["steps"], meta["consumed"]
            self.trained_steps = {int(k): int(v) for k, v in meta.get("trained_steps", {}).items()}
        versions = store.versions()
        self.version = max(self.version, versions[-1] if versions else 0)
        if not versions or versions[-1] < self.version:
            self.publish()

    def publish(self) -> None:
        self.store.publish(self.version, {"version": torch.tensor([self.version])})

    async def update(self, samples: list[dp.TrainSample], rollout_step: int | None = None,
                     training_gpus: int = 1) -> StepStats:
        """The update's duration for the batch's tokens (token counts: the driver sends no tokens).
        A multi-turn trajectory comes as one sample per turn, each carrying the whole context so far;
        its tokens are counted once (its largest sample: the full trajectory), as the loop's STEP
        `train_tokens` and the simulator count them, not once per turn."""
        t0 = time.perf_counter()
        per_trajectory: dict[str, int] = {}
        for i, s in enumerate(samples):
            key = s.trajectory or f"#{i}"
            n = s.token_count or len(s.prompt_tokens) + len(s.completion_tokens)
            per_trajectory[key] = max(per_trajectory.get(key, 0), n)
        tokens = sum(per_trajectory.values())
        await asyncio.sleep(self.profile.train_step_s(tokens, max(1, training_gpus)) * self.time_factor)
        self.version += 1
        self.steps += 1
        self.consumed += len(samples)
        if rollout_step is not None:
            self.trained_steps[rollout_step] = self.version
        if self.ckpt_dir is not None:
            self.ckpt_dir.mkdir(parents=True, exist_ok=True)
            atomic_write(self.ckpt_dir / "emulated.json", json.dumps(
                {"version": self.version, "steps": self.steps, "consumed": self.consumed,
                 "trained_steps": {str(k): v for k, v in self.trained_steps.items()}}).encode())
        self.publish()
        mean_reward = sum(s.reward for s in samples) / max(1, len(samples))
        return StepStats(self.version, 0.0, 0.0, mean_reward, len(samples), 0, 0.0, time.perf_counter() - t0)


async def serve(args: argparse.Namespace, token: str) -> None:

    cfg = GRPOConfig(lr=args.lr, kl_beta=args.kl_beta, max_staleness=args.max_staleness, batch_size=args.batch_size)
    store = WeightStore(Path(args.weights_dir))
    trainer: Trainer
    if args.engine == "emulated" and args.model != "tiny" or args.emulated:
        trainer = EmulatedTrainer(model=args.model, hardware=args.hardware or "H800", tp=int(args.tp or 1),
                                  time_factor=float(args.time_factor or 1.0), store=store,
                                  ckpt_dir=Path(args.ckpt_dir) if args.ckpt_dir else None, job=args.job or "",
                                  batch_size=args.batch_size)
    else:
        trainer = GRPOTrainer(args.model, cfg, ckpt_dir=Path(args.ckpt_dir) if args.ckpt_dir else None, store=store,
                              threads=args.threads, job=args.job or "")
    server = TrainerServer(trainer, token, weights_key=os.environ.get("PEARL_WEIGHTS_KEY", ""),
                           rotate_s=float(os.environ.get("PEARL_WEIGHTS_ROTATE_S", "300")),
                           job_token=os.environ.get("PEARL_JOB_TOKEN", ""))
    runner, port, stop = await serve_until_signal(server.app, args.host, args.port)
    print("PEARL_WORKER_READY " + json.dumps({"port": port, "pid": os.getpid(), "version": trainer.version}), flush=True)
    await stop.wait()
    async with server._lock:  # let a running step finish (its checkpoint is atomic anyway)
        pass
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
    # accepted so the agent can spawn a trainer like any worker
    p.add_argument("--emulated", action="store_true", help="time updates by the profile instead of training")
    for extra in ("--role", "--worker-id", "--engine", "--job", "--hardware", "--time-factor", "--state-dir", "--tp"):
        p.add_argument(extra, default=None)
    args = p.parse_args(argv)
    token = os.environ.get("PEARL_WORKER_SECRET") or os.environ.get("PEARL_TRAINER_TOKEN", "")
    if not token:
        sys.exit("PEARL_TRAINER_TOKEN is not set: refusing to serve without auth")
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        sys.exit(f"refusing to bind {args.host}: the trainer port stays node-local")
    die_with_parent()
    asyncio.run(serve(args, token))


if __name__ == "__main__":
    main()
