"""Job specs from YAML with keys a ROLL user knows, mapped onto the API's job fields.

name: grpo-swe
model: qwen3-8b                      # or pretrain:
engine: emulated                     # or infer_backend: (emulated | torch | vllm)
hardware: h800                       # the training GPUs' chip (and the rollout pool's, unless:)
hardware_types: [H800, H20]          # chip types the rollout pool may gather (GET /api/catalog/ lists them)
environment: swe-like                # or env:
rollout_batch_size: 64               # or batch_size:
num_return_sequences_in_group: 16    # or group_size:
max_staleness: 1
sequence_length: 32768               # or max_trajectory_tokens:
policy: pearl                        # a product policy: GET /api/catalog/ lists them
policy_options: {}                   # the policy's options (GET /api/catalog/)
tensor_parallel_size: 2              # or tp:
gpus: {rollout: 8, training: 4}      # or rollout_gpus: / training_gpus: (rollout: the job's maximum)
priority: 0                          # sharing the cluster: higher is served first
weight: 1                            # the fair share among jobs of equal priority
min_rollout_gpus: 0                  # rollout GPUs guaranteed while the job runs (or gpus: {min_rollout: N})
checkpoint_every: 10                 # a Hugging Face checkpoint every N trainer updates (and at stop)
checkpoint_keep: 3                   # the newest K kept (0: all)
init_from: {job: other-job, step: 20}  # or an absolute checkpoint directory
tracking: {tensorboard: /abs/logdir, mlflow: file:/abs/mlruns, wandb: my-project}
# environment: agent (bring your own agent): agent_command / agent_function, agent_workdir, tasks,
# agent_timeout_s, agent_concurrency (examples/agents/job.yaml)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from controlplane.core.agent_spec import AGENT_FIELDS  # environment "agent": one list, core's
from pearl_cli.client import CliError

ALIASES = {
    "name": "name",
    "model": "model",
    "pretrain": "model",
    "engine": "engine",
    "infer_backend": "engine",
    "hardware": "hardware",
    "hardware_types": "hardware_types",
    "environment": "environment",
    "env": "environment",
    "policy": "policy",
    "policy_options": "policy_options",
    "rollout_batch_size": "batch_size",
    "batch_size": "batch_size",
    "num_return_sequences_in_group": "group_size",
    "group_size": "group_size",
    "max_staleness": "max_staleness",
    "sequence_length": "max_trajectory_tokens",
    "max_trajectory_tokens": "max_trajectory_tokens",
    "tensor_parallel_size": "tp",
    "tp": "tp",
    "rollout_gpus": "rollout_gpus",
    "training_gpus": "training_gpus",
    "priority": "priority",
    "weight": "weight",
    "min_rollout_gpus": "min_rollout_gpus",
    **{k: k for k in ("checkpoint_every", "checkpoint_keep", "checkpoint_dir", "init_from", "tracking")},
    **{k: k for k in AGENT_FIELDS},
}
GPU_KEYS = {"rollout": "rollout_gpus", "training": "training_gpus", "min_rollout": "min_rollout_gpus"}


def load_spec(path: str, *, name: str | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """(API body, API field -> the key the user wrote), so errors name the user's own key."""
    import yaml

    try:
        raw = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise CliError(f"{path}: no such file", 2) from None
    except yaml.YAMLError as exc:
        raise CliError(f"{path}: not valid YAML: {exc}", 2) from None
    if not isinstance(raw, dict):
        raise CliError(f"{path}: a job spec is a mapping of keys to values", 2)
    body: dict[str, Any] = {}
    wrote: dict[str, str] = {}
    for key, value in raw.items():
        if key == "gpus":
            if not isinstance(value, dict) or set(value) - set(GPU_KEYS):
                raise CliError(f"{path}: gpus must be a mapping with 'rollout', 'training' (and 'min_rollout')", 2)
            for k, v in value.items():
                body[GPU_KEYS[k]], wrote[GPU_KEYS[k]] = v, f"gpus.{k}"
            continue
        field = ALIASES.get(str(key))
        if field is None:
            raise CliError(f"{path}: unknown key {key!r}; known keys: {', '.join(sorted(set(ALIASES) | {'gpus'}))}", 2)
        if field in body:
            raise CliError(f"{path}: {key!r} and {wrote[field]!r} both set {field}", 2)
        body[field], wrote[field] = value, str(key)
    if name:
        body["name"], wrote["name"] = name, "--name"
    return body, wrote
