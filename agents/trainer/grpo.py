"""GRPO: group-normalised advantages, the clipped ratio loss with an optional KL to a frozen reference,
AdamW, and atomic safetensors checkpoints (a kill at any point resumes from the last complete update)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import secrets
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from agents import dataplane as dp
from agents import models
from agents.trainer.base import UpdateStats
from agents.trainer.export import Exporter, load_into
from agents.weights import WeightStore, atomic_write

log = logging.getLogger(__name__)


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


def group_advantages(rewards: list[float], groups: list[str], trajectories: list[str] | None = None) -> torch.Tensor:
    """A_i = (r_i - mean_g) / (std_g + eps) within each group (GRPO). With `trajectories`, the
    statistics are over the group's trajectories (one reward each), and every turn of a multi-turn
    trajectory gets its trajectory's advantage: a trajectory with more turns does not weigh more."""
    r = torch.tensor(rewards, dtype=torch.float32)
    adv = torch.zeros_like(r)
    keys = [
        f"{g}\x00{t}" if t else f"{g}\x00#{i}"
        for i, (g, t) in enumerate(zip(groups, trajectories or [""] * len(groups)))
    ]
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

    def __init__(
        self,
        model: str = "tiny",
        config: GRPOConfig | None = None,
        *,
        ckpt_dir: Path | None = None,
        store: WeightStore | None = None,
        threads: int | None = None,
        job: str = "",
        init_from: str = "",
        exporter: Exporter | None = None,
    ) -> None:
        self.config = config or GRPOConfig()
        models.set_threads(threads)
        torch.manual_seed(self.config.seed)
        self.model = models.load_model(model)
        if init_from:  # a new job starts from another's checkpoint (its own checkpoint, below, wins on a restart)
            load_into(self.model, init_from)
        self.exporter = exporter  # Hugging Face checkpoints every `exporter.every` updates and at stop (issue 36)
        self.model.train()
        # right padding, masked out of attention and loss: any id in the vocabulary would do; the model's own
        pad = self.model.config.pad_token_id
        self.pad_id = int(pad) if isinstance(pad, int) and 0 <= pad < self.model.config.vocab_size else 0
        self.ref = models.load_model(model) if self.config.kl_beta > 0 else None
        if self.ref is not None and init_from:
            load_into(self.ref, init_from)
        self.optim = torch.optim.AdamW(
            self.model.parameters(), lr=self.config.lr, betas=self.config.betas, weight_decay=self.config.weight_decay
        )
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

    async def update(
        self, samples: list[dp.TrainSample], rollout_step: int | None = None, training_gpus: int = 1
    ) -> UpdateStats:
        """`update_blocking` on the trainer's own thread: the server's event loop keeps answering meanwhile."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.update_blocking, samples, rollout_step)

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
    def update_blocking(self, samples: list[dp.TrainSample], rollout_step: int | None = None) -> UpdateStats:
        """One GRPO update, on the calling thread. With `rollout_step`, the update of that step of the RL loop: it
        publishes a new version even if no sample survives the staleness check (one version per step)."""
        t0 = time.perf_counter()
        fresh = self.admit(samples)
        rejected = len(samples) - len(fresh)
        if not fresh:
            if rollout_step is not None:
                self._advance(rollout_step)
            return UpdateStats(self.version, 0.0, 0.0, 0.0, 0, rejected)
        adv = group_advantages([s.reward for s in fresh], [s.group for s in fresh], [s.trajectory for s in fresh])
        seqs = [s.prompt_tokens + s.completion_tokens for s in fresh]
        width = max(len(x) for x in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
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
        return UpdateStats(
            self.version,
            float(loss.detach()),
            grad_norm,
            sum(s.reward for s in fresh) / len(fresh),
            len(fresh),
            rejected,
            float(kl_val.detach()),
            time.perf_counter() - t0,
        )

    def _advance(self, rollout_step: int | None) -> None:
        self.steps += 1
        self.version += 1
        if rollout_step is not None:
            self.trained_steps[rollout_step] = self.version
        if self.ckpt_dir:  # checkpoint first: a published version always has a checkpoint to resume from
            self.save_checkpoint()
        if self.store:
            self.publish()
        if self.exporter is not None and self.exporter.due(self.version):
            try:
                self.export()
            except Exception:  # a by-product: a full disk or a bad directory never stops training (logged)
                log.exception("the checkpoint of v%d failed; training goes on", self.version)

    def export(self) -> Path | None:
        """Write the current weights as a Hugging Face checkpoint (named by the rollout step whose update made
        them); at stop too, unless that one is written already. None before any update."""
        if self.exporter is None or self.version == 0:
            return None
        step = max((s for s, v in self.trained_steps.items() if v == self.version), default=self.version - 1)
        return self.exporter.export(self.model, step=step, version=self.version)

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
        meta = {
            "job": self.job,
            "version": self.version,
            "steps": self.steps,
            "stale_rejected": self.stale_rejected,
            "consumed": self.consumed,
            "param_groups": groups,
            "config": asdict(self.config),
            "trained_steps": {str(k): v for k, v in self.trained_steps.items()},
        }
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
