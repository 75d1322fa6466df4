"""LoRAAdapter: a PEFT LoRA adapter folder (adapter_config.json and
adapter_model.safetensors), read whole and checked against the base model's config,
or refused by name.

A targeted product y = x W^T gains s * (x A^T) B^T, A (r, in) and B (out, r) from the
file, s = lora_alpha / r (rsLoRA: lora_alpha / sqrt(r)); rank_pattern and
alpha_pattern set r and alpha per module, matched as PEFT matches them. The products
an adapter may target are the decoder layers' seven (Phi-3's fused qkv_proj and
gate_up_proj split into them); the embedding, the head, DoRA, LoRA biases and
modules_to_save would change the math in ways this engine does not run: refused.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass

import numpy as np

from ..formats.safetensors_io import read_safetensors
from .config import ModelConfig

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
# the products that share an input, in a layer's order: one add_lora call each
SHARED_INPUTS = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",))
FUSED_MODULES = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
_TENSOR = re.compile(r"(?:base_model\.model\.)?model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)"
                     r"\.lora_([AB])\.weight")

# adapter_config.json keys read here, and those that change nothing at inference (how
# the adapter was initialized or trained, where it came from; which layers and modules
# it targets: its tensors say that). Any other key set to a value is refused by name.
_READ = {"r", "lora_alpha", "use_rslora", "rank_pattern", "alpha_pattern", "peft_type", "auto_mapping"}
_IGNORED = {"base_model_name_or_path", "revision", "task_type", "inference_mode", "peft_version",
            "lora_dropout", "init_lora_weights", "loftq_config", "eva_config", "corda_config",
            "lora_ga_config", "target_modules", "exclude_modules", "layers_to_transform",
            "layers_pattern", "megatron_core", "qalora_group_size", "ensure_weight_tying",
            "runtime_config", "bias"}  # (bias: read below, "none" only)


@dataclass(frozen=True)
class LoRAWeights:
    """One product's low-rank term: a (r, in) and b (out, r) float32, scale s."""
    a: np.ndarray
    b: np.ndarray
    scale: float

    @property
    def rank(self) -> int:
        return self.a.shape[0]


class LoRAAdapter:
    def __init__(self, path: str, modules: dict[tuple[int, str], LoRAWeights]):
        self.path = path
        self.modules = modules  # (layer, module name) -> its term

    @property
    def rank(self) -> int:
        return max(w.rank for w in self.modules.values())

    @classmethod
    def load(cls, path: str | os.PathLike, cfg: ModelConfig, max_rank: int) -> "LoRAAdapter":
        """Read and check the folder at path against the base model; a ValueError names
        what does not fit (a module, a shape, the rank over max_rank, the architecture)."""
        path = os.fspath(path)
        for name in (CONFIG_FILE, WEIGHTS_FILE):
            if not os.path.isfile(os.path.join(path, name)):
                raise ValueError(f"LoRA adapter {path!r}: no {name} (a PEFT adapter folder "
                                 f"holds {CONFIG_FILE} and {WEIGHTS_FILE})")
        with open(os.path.join(path, CONFIG_FILE)) as f:
            config = json.load(f)
        if not isinstance(config, dict):
            raise ValueError(f"LoRA adapter {path!r}: {CONFIG_FILE} is not a JSON object")
        _check_config(config, cfg, path)
        pairs = _pairs(read_safetensors(os.path.join(path, WEIGHTS_FILE)), cfg, path)
        modules = {}
        for (layer, module), (a, b, name) in sorted(pairs.items()):
            rank = _pattern(config.get("rank_pattern"), name, config.get("r", a.shape[0]))
            alpha = _pattern(config.get("alpha_pattern"), name, config.get("lora_alpha", 8))
            if a.shape[0] != rank:
                raise ValueError(f"LoRA adapter {path!r}: {name}.lora_A has rank {a.shape[0]}, "
                                 f"but {CONFIG_FILE} says r={rank}")
            if rank > max_rank:
                raise ValueError(f"LoRA adapter {path!r} has rank {rank} ({name}); max_lora_rank "
                                 f"is {max_rank}: start the engine with a larger max_lora_rank")
            scale = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
            for part, b_rows in _split(module, b, cfg):
                modules[(layer, part)] = LoRAWeights(a, b_rows, float(scale))
                _check_shape(modules[(layer, part)], part, cfg, f"{path!r}: {name}")
        if not modules:
            raise ValueError(f"LoRA adapter {path!r}: {WEIGHTS_FILE} holds no LoRA weights")
        return cls(path, modules)


def _check_config(config: dict, cfg: ModelConfig, path: str) -> None:
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"adapter {path!r} is a {config['peft_type']} adapter; only LoRA "
                         f"adapters are supported")
    base = (config.get("auto_mapping") or {}).get("base_model_class")
    if base is not None and base != cfg.architecture:
        raise ValueError(f"LoRA adapter {path!r} was made for {base}; this model is a "
                         f"{cfg.architecture}")
    if config.get("bias", "none") != "none":
        raise ValueError(f"LoRA adapter {path!r}: bias={config['bias']!r} (trained biases) "
                         f"is not supported")
    for key, value in config.items():
        if key not in _READ and key not in _IGNORED and value not in (None, False, {}, [], "", 0):
            raise ValueError(f"LoRA adapter {path!r}: {CONFIG_FILE} sets {key}={value!r}, "
                             f"which tinypaged does not run; refused rather than ignored")
    r, alpha = config.get("r", 8), config.get("lora_alpha", 8)
    if not (isinstance(r, int) and r > 0) or not (isinstance(alpha, (int, float)) and alpha > 0):
        raise ValueError(f"LoRA adapter {path!r}: r={r!r} and lora_alpha={alpha!r} must be positive")


def _pattern(patterns: dict | None, name: str, default):
    """PEFT's rank_pattern / alpha_pattern lookup: the first key that matches the
    module's full name at a dot boundary (a key starting with ^ is a whole regex)."""
    for key, value in (patterns or {}).items():
        regex = key if key.startswith("^") else rf"(.*\.)?({key})$"
        if re.match(regex, name):
            return value
    return default


def _pairs(tensors: dict, cfg: ModelConfig, path: str) -> dict[tuple[int, str], tuple]:
    """(layer, module) -> (A, B float32, the module's name), each tensor's name checked."""
    found: dict[tuple[int, str], dict] = {}
    modules = ATTENTION_MODULES + MLP_MODULES + (tuple(FUSED_MODULES) if cfg.fused_projections else ())
    for name, tensor in tensors.items():
        m = _TENSOR.fullmatch(name)
        section = "mlp" if m is not None and m.group(3) in MLP_MODULES + ("gate_up_proj",) else "self_attn"
        if m is None or m.group(3) not in modules or m.group(2) != section:
            what = ("the embedding" if "embed" in name else "the lm_head" if "lm_head" in name
                    else "a module tinypaged does not adapt")
            raise ValueError(f"LoRA adapter {path!r}: tensor {name!r} targets {what}; "
                             f"supported targets: {', '.join(modules)}")
        layer = int(m.group(1))
        if layer >= cfg.num_hidden_layers:
            raise ValueError(f"LoRA adapter {path!r}: tensor {name!r} is for layer {layer}; "
                             f"the model has {cfg.num_hidden_layers} layers")
        if tensor.ndim != 2:
            raise ValueError(f"LoRA adapter {path!r}: tensor {name!r} has shape "
                             f"{list(tensor.shape)}, expected a matrix")
        found.setdefault((layer, section, m.group(3)), {})[m.group(4)] = np.ascontiguousarray(tensor, np.float32)
    for (layer, _, module), ab in found.items():
        if len(ab) != 2:
            missing = "B" if "A" in ab else "A"
            raise ValueError(f"LoRA adapter {path!r}: layer {layer}'s {module} has no lora_{missing}")
        if ab["A"].shape[0] != ab["B"].shape[1]:
            raise ValueError(f"LoRA adapter {path!r}: layer {layer}'s {module}: lora_A has rank "
                             f"{ab['A'].shape[0]}, lora_B {ab['B'].shape[1]}")
    return {(layer, module): (ab["A"], ab["B"], f"model.layers.{layer}.{section}.{module}")
            for (layer, section, module), ab in found.items()}


def _split(module: str, b: np.ndarray, cfg: ModelConfig):
    """[(module, B rows)]: a fused module's B split into its parts (they share A)."""
    if module not in FUSED_MODULES:
        return [(module, b)]
    sizes = (cfg.q_size, cfg.kv_size, cfg.kv_size) if module == "qkv_proj" else (cfg.intermediate_size,) * 2
    if b.shape[0] != sum(sizes):
        raise ValueError(f"{module}.lora_B has {b.shape[0]} rows; the model's {module} has {sum(sizes)}")
    bounds = np.cumsum((0,) + sizes)
    return [(part, b[bounds[i]:bounds[i + 1]]) for i, part in enumerate(FUSED_MODULES[module])]


def product_shape(module: str, cfg: ModelConfig) -> tuple[int, int]:
    """(out, in) of a decoder layer's product."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    return {"q_proj": (cfg.q_size, h), "k_proj": (cfg.kv_size, h), "v_proj": (cfg.kv_size, h),
            "o_proj": (h, cfg.q_size), "gate_proj": (i, h), "up_proj": (i, h),
            "down_proj": (h, i)}[module]


def _check_shape(w: LoRAWeights, module: str, cfg: ModelConfig, where: str) -> None:
    out, inner = product_shape(module, cfg)
    if w.a.shape[1] != inner or w.b.shape[0] != out:
        raise ValueError(f"LoRA adapter {where}: lora_A {list(w.a.shape)} and lora_B "
                         f"{list(w.b.shape)} do not fit the model's {module} ({out} x {inner}: "
                         f"lora_A [r, {inner}], lora_B [{out}, r]); an adapter for another model?")
