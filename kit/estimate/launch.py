"""Read the YAML (or JSON) file ``accelerate config`` writes into the estimate's multi-GPU keywords.

The fields are accelerate's ``ClusterConfig`` (``accelerate/commands/config/config_args.py``), as
``accelerate config`` fills them (``commands/config/cluster.py``):

- ``distributed_type``: ``NO`` (one GPU), ``MULTI_GPU`` (DDP), ``FSDP``, ``DEEPSPEED``; ``num_processes``
  is the number of GPUs over all machines; ``mixed_precision`` ``no``/``fp16``/``bf16``.
- ``fsdp_config``: ``fsdp_version`` (1 or 2); ``fsdp_reshard_after_forward``: a bool for FSDP2, a sharding
  strategy for FSDP1 (``FULL_SHARD``, ``SHARD_GRAD_OP``, ``NO_SHARD``, ``HYBRID_SHARD``...; older files name it
  ``fsdp_sharding_strategy``, also as 1-5); ``fsdp_offload_params``; ``fsdp_activation_checkpointing``.
- ``deepspeed_config``: ``zero_stage``, ``offload_optimizer_device`` / ``offload_param_device``
  (``none``, ``cpu``, ``nvme``), ``gradient_accumulation_steps``; or ``deepspeed_config_file``, a
  DeepSpeed JSON (``zero_optimization.stage``, ``offload_optimizer.device``), read when it exists.

>>> import tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "fsdp.yaml")
>>> _ = open(path, "w").write("distributed_type: FSDP\\nnum_processes: 4\\nmixed_precision: bf16\\n"
...                           "fsdp_config:\\n  fsdp_version: 2\\n  fsdp_reshard_after_forward: true\\n")
>>> read_accelerate_config(path)
{'strategy': 'fsdp', 'num_gpus': 4, 'cpu_offload': False, 'precision': 'bf16'}
"""
from __future__ import annotations

import json
import os

from kit.inputs import InputError, whole_number

# FSDP1's sharding strategies (accelerate's FSDP_SHARDING_STRATEGY, 1-based in old files) -> the kit's
_FSDP1 = {"FULL_SHARD": "fsdp", "SHARD_GRAD_OP": "fsdp-grad-op", "NO_SHARD": "ddp", "HYBRID_SHARD": "fsdp",
          "HYBRID_SHARD_ZERO2": "fsdp-grad-op"}
_FSDP1_NUMBERS = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")


def read_accelerate_config(path) -> dict:
    """The estimate keywords of an accelerate config file: ``strategy``, ``num_gpus``, ``cpu_offload``,
    and where the file sets them ``precision``, ``grad_accum`` and ``gradient_checkpointing``.

    Raises :class:`kit.inputs.InputError` (named ``accelerate_config``) for a file it cannot read, a file that is
    no accelerate config, a field it cannot read, or a launch the kit does not model (TPU, Megatron-LM, a CPU-only
    launch).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise InputError(NAME, f"accelerate_config must be the path of the YAML `accelerate config` wrote, not "
                               f"{type(path).__name__}.")
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or type(exc).__name__
        raise InputError(NAME, f"cannot read {path!r} ({why}): pass the file "
                         "`accelerate config` wrote (default ~/.cache/huggingface/accelerate/default_config.yaml).")
    cfg = _load(text, path)
    if not set(cfg) & _CLUSTER_KEYS:
        raise InputError(NAME, f"{path} is not an accelerate config: it has none of {', '.join(sorted(_CLUSTER_KEYS))}"
                         " (its keys: " + ", ".join(map(str, list(cfg)[:6])) + "). Pass the file `accelerate "
                         "config` wrote (default ~/.cache/huggingface/accelerate/default_config.yaml).")
    kind = str(cfg.get("distributed_type", "NO")).upper().replace("DISTRIBUTEDTYPE.", "")
    n = max(_whole(f"{path}: num_processes", cfg.get("num_processes"), 1), 1)
    out: dict = {}
    if cfg.get("use_cpu") or kind == "MULTI_CPU":
        raise InputError(NAME, f"{path}: a CPU launch (use_cpu / MULTI_CPU) has no GPU to estimate.")
    if kind == "NO" or (kind == "MULTI_GPU" and n == 1):
        out.update(strategy="single", num_gpus=1, cpu_offload=False)
    elif kind in ("MULTI_GPU", "MULTI_XPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_HPU"):
        out.update(strategy="ddp", num_gpus=n, cpu_offload=False)
    elif kind == "FSDP":
        out.update(_fsdp(_mapping(cfg, "fsdp_config", path), n, f"{path}: fsdp_config"))
    elif kind == "DEEPSPEED":
        out.update(_deepspeed(_mapping(cfg, "deepspeed_config", path), n, os.path.dirname(path),
                              f"{path}: deepspeed_config"))
    else:
        raise InputError(NAME, f"{path}: distributed_type {kind} is not modelled by the kit (it "
                         "models NO, MULTI_GPU, FSDP and DEEPSPEED).")
    mp = str(cfg.get("mixed_precision") or "no").lower()
    if mp in ("fp16", "bf16"):
        out["precision"] = mp
    elif mp == "fp8":
        out["precision"] = "bf16"  # fp8 runs its matmuls in fp8 inside bf16 autocast: bf16 is the closer estimate
    return out


NAME = "accelerate_config"
# accelerate's ClusterConfig fields (a file with none of them is some other YAML)
_CLUSTER_KEYS = {"compute_environment", "distributed_type", "num_processes", "num_machines", "mixed_precision",
                 "machine_rank", "main_training_function", "use_cpu", "fsdp_config", "deepspeed_config",
                 "gpu_ids", "downcast_bf16", "megatron_lm_config"}


def _whole(what: str, value, default: int, minimum: int = 0, name: str = NAME) -> int:
    if value is None or value == "":
        return default
    n = _as_whole(value)
    if n is None or n < minimum:
        raise InputError(name, f"{what} must be a whole number >= {minimum}, not {value!r}: fix that line of the file.")
    return n


def _as_whole(value):
    try:
        return whole_number("n", value, minimum=None)
    except InputError:
        return None


def _mapping(cfg: dict, key: str, path: str) -> dict:
    v = cfg.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise InputError(NAME, f"{path}: {key} must be a mapping of {key.split('_')[0]}_* settings (as `accelerate "
                         f"config` writes it, one indented line each), not {v!r}.")
    return v


def _load(text: str, path: str) -> dict:
    try:
        if path.endswith(".json"):
            cfg = json.loads(text)
        else:
            import yaml

            cfg = yaml.safe_load(text)
    except Exception as exc:
        raise InputError(NAME, f"{path} is not valid {'JSON' if path.endswith('.json') else 'YAML'}:"
                         f" {' '.join(str(exc).split())}")
    if not isinstance(cfg, dict):
        raise InputError(NAME, f"{path}: expected the mapping `accelerate config` writes.")
    return cfg


def _fsdp(fsdp_config: dict, num_gpus: int, where: str, name: str = NAME) -> dict:
    version = _whole(f"{where} fsdp_version", fsdp_config.get("fsdp_version"), 1, 1, name)
    reshard = fsdp_config.get("fsdp_reshard_after_forward", fsdp_config.get("fsdp_sharding_strategy", True))
    if version >= 2 and isinstance(reshard, bool):
        strategy = "fsdp" if reshard else "fsdp-grad-op"
    else:
        number = None if isinstance(reshard, bool) else _as_whole(reshard)
        name_ = ("FULL_SHARD" if reshard else "SHARD_GRAD_OP") if isinstance(reshard, bool) else \
            _FSDP1_NUMBERS[number - 1] if number is not None and 1 <= number <= len(_FSDP1_NUMBERS) else \
            str(reshard).strip().upper()
        if name_ not in _FSDP1:
            raise InputError(name, f"{where}: fsdp sharding strategy {reshard!r}: expected one of "
                             f"{', '.join(_FSDP1)} (or 1 to {len(_FSDP1_NUMBERS)}, "
                             "or true/false with fsdp_version: 2).")
        strategy = _FSDP1[name_]
    offload = _yes(fsdp_config.get("fsdp_offload_params", False)) and strategy != "ddp"
    out = dict(strategy=strategy if num_gpus > 1 or strategy != "ddp" else "single", num_gpus=num_gpus,
               cpu_offload=offload and strategy == "fsdp")
    if offload and strategy == "fsdp-grad-op":
        out["strategy"] = "fsdp"  # offloading needs the parameters resharded: FSDP2's CPUOffloadPolicy does so
    if _yes(fsdp_config.get("fsdp_activation_checkpointing", False)):
        out["gradient_checkpointing"] = True
    return out


def _ds_json(file: str, name: str) -> dict:
    """A DeepSpeed JSON config, or one sentence on why it cannot be read."""
    try:
        with open(file, encoding="utf-8") as f:
            ds = json.load(f)
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(name, f"cannot read the DeepSpeed config {file!r} "
                         f"({getattr(exc, 'strerror', None) or type(exc).__name__}): check the path.")
    except json.JSONDecodeError as exc:
        raise InputError(name, f"the DeepSpeed config {file!r} is not valid JSON ({exc.msg}, line {exc.lineno}): "
                         "it may be cut short; fix or copy it again.")
    if not isinstance(ds, dict):
        raise InputError(name, f"the DeepSpeed config {file!r} must hold a JSON object, not {type(ds).__name__}.")
    return ds


def _deepspeed(ds_config: dict, num_gpus: int, here: str, where: str, name: str = NAME) -> dict:
    stage, opt_dev, param_dev, accum = ds_config.get("zero_stage"), ds_config.get("offload_optimizer_device"), \
        ds_config.get("offload_param_device"), ds_config.get("gradient_accumulation_steps")
    file = ds_config.get("deepspeed_config_file")
    if file:
        ds = _ds_json(file if os.path.isabs(str(file)) else os.path.join(here, str(file)), name)
        zo = ds.get("zero_optimization") if isinstance(ds.get("zero_optimization"), dict) else {}
        stage = zo.get("stage", stage)
        opt_dev = (zo.get("offload_optimizer") or {}).get("device", opt_dev)
        param_dev = (zo.get("offload_param") or {}).get("device", param_dev)
        accum = ds.get("gradient_accumulation_steps", accum)
    raw, stage = stage, 2 if stage in (None, "auto") else _as_whole(stage)
    if stage is None or not 0 <= stage <= 3:
        raise InputError(name, f"{where}{' (' + str(file) + ')' if file else ''}: ZeRO stage {raw!r} is not one "
                         "DeepSpeed has: the stages are 0, 1, 2 and 3.")
    if stage == 0:
        out = dict(strategy="ddp" if num_gpus > 1 else "single", num_gpus=num_gpus, cpu_offload=False)
    else:
        off = any(str(d or "none").lower() in ("cpu", "nvme") for d in (opt_dev, param_dev))
        out = dict(strategy=f"zero{stage}", num_gpus=num_gpus, cpu_offload=off)
    accum = _as_whole(accum) if accum not in (None, "auto") else None
    if accum is not None and accum > 1:
        out["grad_accum"] = accum
    return out


def read_training_launch(args) -> tuple[dict, list]:
    """(estimate keywords, notes) of a ``TrainingArguments``' ``fsdp``/``fsdp_config`` or ``deepspeed``; ``({}, [])``
    for neither. The GPUs are the launch's ``WORLD_SIZE`` (torchrun and ``accelerate launch`` set it per rank).

    >>> from types import SimpleNamespace as NS
    >>> read_training_launch(NS(fsdp=True, fsdp_config={"version": 2, "reshard_after_forward": False},
    ...                         deepspeed=None, world_size=4))[0]
    {'strategy': 'fsdp-grad-op', 'num_gpus': 4, 'cpu_offload': False}
    """
    env = os.environ.get("WORLD_SIZE")
    n = _as_whole(env) if env not in (None, "") else None
    if env not in (None, "") and (n is None or n < 1):
        raise InputError("WORLD_SIZE", f"the environment variable WORLD_SIZE is {env!r}, not a number of processes "
                         "(torchrun and accelerate launch set it to a whole number >= 1): unset it or fix it.")
    n = max(n or getattr(args, "world_size", 1) or 1, 1)
    notes = [] if n > 1 else ["WORLD_SIZE is 1 in this process: the multi-GPU estimate is for one GPU; under "
                              "torchrun or accelerate launch each rank sees the launch's number of GPUs"]
    if getattr(args, "fsdp", None):
        fc = getattr(args, "fsdp_config", None) or {}
        if not isinstance(fc, dict):
            raise InputError("fsdp_config", f"TrainingArguments.fsdp_config must be a dict (or a JSON file's path, "
                             f"which TrainingArguments reads into one), not {fc!r}.")
        r = fc.get("reshard_after_forward", True)
        return _fsdp({"fsdp_version": fc.get("version", 2 if isinstance(r, bool) else 1),
                      "fsdp_reshard_after_forward": r,
                      "fsdp_offload_params": fc.get("cpu_offload", False)}, n, "TrainingArguments.fsdp_config",
                     "fsdp_config"), notes
    ds = getattr(args, "deepspeed", None)
    if ds:
        ds = ds if isinstance(ds, dict) else _ds_json(os.fspath(ds), "deepspeed")
        zo = ds.get("zero_optimization") if isinstance(ds.get("zero_optimization"), dict) else {}
        return _deepspeed({"zero_stage": zo.get("stage", 0), "offload_optimizer_device": (zo.get(
            "offload_optimizer") or {}).get("device"), "offload_param_device": (zo.get("offload_param") or {}).get(
            "device")}, n, "", "TrainingArguments.deepspeed", "deepspeed"), notes
    return {}, []


def _yes(value) -> bool:
    return value is True or str(value).strip().lower() in ("true", "yes", "1")


def launch_command(path, script: str = "train.py") -> str:
    """The ``accelerate launch`` line an estimate made from ``path`` describes.

    >>> launch_command("fsdp.yaml")
    'accelerate launch --config_file fsdp.yaml train.py'
    """
    return f"accelerate launch --config_file {os.fspath(path)} {script}"
