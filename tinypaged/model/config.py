"""ModelConfig: the shape of a decoder-only transformer, read from HF `config.json`.

Never silently wrong: every key of a config.json is either read (the keys an
architecture consumes, below), ignored on purpose (IGNORED_KEYS: they do not change
what inference computes), or refused by name. A key nobody listed is refused too:
a setting we do not know may change the math.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

from ..kernels.rope import NO_ROPE, Rope, rope_from_config
from .families import FAMILIES
from .family import LAYER_TYPES, Family

# what a checkpoint's "dtype" (or older "torch_dtype") may say; others read as float32
CHECKPOINT_DTYPES = ("float32", "float16", "bfloat16")

# the keys every supported architecture reads
COMMON_KEYS = frozenset({
    "architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size",
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_parameters", "rope_scaling",
    "tie_word_embeddings", "bos_token_id", "eos_token_id", "hidden_act",
    "torch_dtype", "dtype",  # the checkpoint's precision: kv_cache_dtype="auto" follows it
})
# keys that never change inference's math: training (dropout, initialization), the
# cache switch, generation defaults, labels, tooling and provenance
IGNORED_KEYS = frozenset({
    "transformers_version", "initializer_range", "use_cache",
    "pad_token_id", "sep_token_id", "decoder_start_token_id", "attention_dropout",
    "hidden_dropout", "embd_pdrop", "resid_pdrop", "attn_pdrop", "return_dict",
    "output_hidden_states", "output_attentions", "torchscript", "use_bfloat16",
    "tf_legacy_loss", "pruned_heads", "chunk_size_feed_forward", "is_encoder_decoder",
    "is_decoder", "cross_attention_hidden_size", "add_cross_attention",
    "tie_encoder_decoder", "finetuning_task", "id2label", "label2id", "tokenizer_class",
    "prefix", "task_specific_params", "problem_type", "max_length", "min_length",
    "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty",
    "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty",
    "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate",
    "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
    "auto_map", "unsloth_version", "unsloth_fixed", "use_return_dict",
    "transformers.js_config", "is_llama_config",  # (HuggingFaceTB's SmolLM configs)
    "is_matryoshka", "matryoshka_dimensions",  # (shorter embeddings: model/pooling.py reads them)
})


# layers a config may declare: released models have up to ~160; a hostile file's 10**9
# would have per-layer tables built (gigabytes) before the tensors could refuse it
MAX_LAYERS = 4096


@dataclass(slots=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int = 0  # 0: hidden_size // num_attention_heads
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope: Rope = field(default_factory=Rope)
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v projections (Qwen2; Llama's attention_bias)
    o_proj_bias: bool = False  # bias on o_proj too (Llama's attention_bias)
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    sliding_window: int | None = None  # tokens a sliding layer attends to (itself included)
    layer_types: tuple[str, ...] = ()  # per layer, one of LAYER_TYPES; (): all full
    # what attention, the embeddings and the file's shapes take from the config (each
    # family's file says which it sets); how its layer goes is the family's own (family.py)
    rope_layers: tuple[bool, ...] = ()  # per layer, whether it rotates q and k; (): all do
    embedding_scale: float = 1.0  # embeddings times this
    attention_scale: float | None = None  # scores times this; None: 1 / sqrt(head_dim)
    fused_projections: bool = False  # the file holds qkv_proj and gate_up_proj (Phi-3)
    local_rope: Rope | None = None  # the sliding layers' RoPE where it differs (Gemma 3)
    attn_softcap: float | None = None  # scores as cap * tanh(score / cap) (Gemma 2)
    final_softcap: float | None = None  # logits as cap * tanh(logit / cap) (Gemma 2)
    dtype: str = "float32"  # the checkpoint's precision, one of CHECKPOINT_DTYPES (GGUF: float16)
    settings: dict = field(default_factory=dict)  # a family's own values, read by its file alone
    embedding_only: bool = False  # a bare base model (Qwen3Model, LlamaModel: BASE_MODELS),
    #   as embedding models ship: no lm_head; it embeds and does not generate

    def __post_init__(self):
        if self.architecture not in FAMILIES:
            raise ValueError(f"architecture {self.architecture!r} is not supported "
                             f"(supported: {', '.join(FAMILIES)})")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ValueError(f"config {name}={getattr(self, name)} must be positive")
        if self.head_dim == 0:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(f"hidden_size={self.hidden_size} is not divisible by "
                                 f"num_attention_heads={self.num_attention_heads}")
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} is not a multiple "
                             f"of num_key_value_heads={self.num_key_value_heads}")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ValueError(f"sliding_window={self.sliding_window} must be positive")
        if self.layer_types and len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types names {len(self.layer_types)} layers, but "
                             f"num_hidden_layers={self.num_hidden_layers}")
        for kind in self.layer_types:
            if kind not in LAYER_TYPES:
                raise ValueError(f"layer_types holds {kind!r}; known: {', '.join(LAYER_TYPES)}")
        if self.rope_layers and len(self.rope_layers) != self.num_hidden_layers:
            raise ValueError(f"rope_layers names {len(self.rope_layers)} layers, but "
                             f"num_hidden_layers={self.num_hidden_layers}")
        for name in ("attn_softcap", "final_softcap"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)} must be positive")

    @property
    def family(self) -> Family:
        return FAMILIES[self.architecture]

    def uses_rope(self, layer: int) -> bool:
        return not self.rope_layers or self.rope_layers[layer]

    def rope_of(self, layer: int) -> Rope:
        """The RoPE of layer (NO_ROPE where it has none)."""
        if not self.uses_rope(layer):
            return NO_ROPE
        if self.local_rope is not None and self.window(layer) is not None:
            return self.local_rope
        return self.rope

    @property
    def scores_scale(self) -> float:
        """What attention multiplies q . k by."""
        return self.attention_scale if self.attention_scale is not None else self.head_dim ** -0.5

    @property
    def rope_theta(self) -> float:
        return self.rope.theta

    def window(self, layer: int) -> int | None:
        """How many tokens layer attends to (itself included), or None: all of them."""
        if self.sliding_window is None:
            return None
        if self.layer_types and self.layer_types[layer] != "sliding_attention":
            return None
        return self.sliding_window

    @property
    def smallest_window(self) -> int | None:
        windows = [w for w in map(self.window, range(self.num_hidden_layers)) if w is not None]
        return min(windows) if windows else None

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @classmethod
    def from_dict(cls, cfg: dict, where: str = "config.json") -> "ModelConfig":
        """Checked: integer fields are JSON integers, token ids lie inside the vocabulary,
        architectures is a list. Errors are ValueErrors naming `where` and the key."""
        archs = cfg.get("architectures")
        if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
            raise ValueError(f"{where}: 'architectures' must be a list of names, e.g. "
                             f"[\"LlamaForCausalLM\"], got {archs!r}")
        arch = archs[0]
        embedding_only = arch in BASE_MODELS  # (its family's, without the head)
        arch = BASE_MODELS.get(arch, arch)
        if arch not in FAMILIES:
            raise ValueError(f"{where}: architecture {arch!r} is not supported "
                             f"(supported: {', '.join(FAMILIES)})")
        check_keys(cfg, arch, where)
        act = cfg.get("hidden_act", "silu")
        if act != "silu" and not FAMILIES[arch].reads_activation:
            raise ValueError(f"{where}: hidden_act={act!r} is not supported (only 'silu')")
        get = _Reader(cfg, where)
        vocab = get.integer("vocab_size", positive=True)
        heads = get.integer("num_attention_heads", positive=True)
        layers = get.integer("num_hidden_layers", positive=True)
        if layers > MAX_LAYERS:  # (before the family builds anything per layer)
            raise ValueError(f"{where}: num_hidden_layers={layers} is more than any model has "
                             f"(at most {MAX_LAYERS})")
        max_positions = get.integer("max_position_embeddings", 2048)
        family_fields = FAMILIES[arch].read(get, layers)
        rope = family_fields.pop("rope", None) or rope_from_config(cfg, where, max_positions)
        try:
            return cls(
                architecture=arch,
                vocab_size=vocab,
                hidden_size=get.integer("hidden_size"),
                intermediate_size=get.integer("intermediate_size"),
                num_hidden_layers=layers,
                num_attention_heads=heads,
                num_key_value_heads=get.integer("num_key_value_heads", heads),
                head_dim=get.integer("head_dim", 0),
                max_position_embeddings=max_positions,
                rms_norm_eps=get.number("rms_norm_eps", 1e-6),
                rope=rope,
                # (a base model has no head: the embedding stands in, never used)
                tie_word_embeddings=get.boolean("tie_word_embeddings", False) or embedding_only,
                embedding_only=embedding_only,
                bos_token_id=get.token_ids("bos_token_id", vocab, single=True),
                eos_token_ids=get.token_ids("eos_token_id", vocab),
                dtype=checkpoint_dtype(cfg),
                **family_fields,
            )
        except ValueError as e:  # ModelConfig's own checks do not know the file
            message = str(e)
            raise ValueError(message if message.startswith(where) else f"{where}: {message}") from None

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> "ModelConfig":
        """Read `path` (a config.json file or a model folder holding one)."""
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"model config not found: {path}")
        try:
            with open(path, encoding="utf-8") as f:
                cfg = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: invalid JSON ({e})") from None
        if not isinstance(cfg, dict):
            raise ValueError(f"{path}: expected a JSON object")
        return cls.from_dict(cfg, path)


def checkpoint_dtype(cfg: dict) -> str:
    """The precision a config.json declares ("dtype", or "torch_dtype" before
    transformers 4.56); float32 where it is absent or names no float kind we know
    (the safer choice for what follows it: the KV cache's dtype)."""
    declared = cfg.get("dtype", cfg.get("torch_dtype"))
    return declared if declared in CHECKPOINT_DTYPES else "float32"


# the bare base models embedding models ship as (sentence-transformers saves AutoModel's),
# by their family's architecture name
BASE_MODELS = {"LlamaModel": "LlamaForCausalLM", "MistralModel": "MistralForCausalLM",
               "Qwen2Model": "Qwen2ForCausalLM", "Qwen3Model": "Qwen3ForCausalLM",
               "Gemma3TextModel": "Gemma3ForCausalLM", "GemmaModel": "GemmaForCausalLM",
               "Gemma2Model": "Gemma2ForCausalLM"}


def check_keys(cfg: dict, arch: str, where: str) -> None:
    """Refuse, by name, a key that arch does not read and that is not known to be
    harmless: it may change the math, and running without it would be silently wrong."""
    known = COMMON_KEYS | FAMILIES[arch].keys | IGNORED_KEYS
    unknown = sorted(key for key in cfg if key not in known and not key.startswith("_")
                     and "dropout" not in key and not key.endswith("_pdrop"))  # training only
    if unknown:
        raise ValueError(f"{where}: {arch} with {', '.join(map(repr, unknown))}: "
                         f"{'a key' if len(unknown) == 1 else 'keys'} tinypaged does not read, "
                         f"which may change the model's output, so the model is refused")


class _Reader:
    """Typed reads of config.json keys; a missing key takes the default (None or
    null means absent), a required one (no default) is an error."""
    _REQUIRED = object()

    def __init__(self, cfg: dict, where: str):
        self.cfg, self.where = cfg, where

    def _get(self, key: str, default):
        value = self.cfg.get(key)
        if value is None:
            if default is self._REQUIRED:
                raise ValueError(f"{self.where} is missing the required key {key!r}")
            return default, True
        return value, False

    def _wrong(self, key: str, value, kind: str) -> ValueError:
        return ValueError(f"{self.where}: {key} must be {kind}, got {value!r}")

    def integer(self, key: str, default=_REQUIRED, positive: bool = False) -> int:
        value, absent = self._get(key, default)
        if not absent and (not isinstance(value, int) or isinstance(value, bool)):
            raise self._wrong(key, value, "an integer")
        if positive and value <= 0:
            raise ValueError(f"{self.where}: {key}={value} must be positive")
        return value

    def number(self, key: str, default) -> float:
        value, absent = self._get(key, default)
        if not absent and (not isinstance(value, (int, float)) or isinstance(value, bool)
                           or not math.isfinite(value)):
            raise self._wrong(key, value, "a finite number")
        return float(value)

    def boolean(self, key: str, default: bool) -> bool:
        value, absent = self._get(key, default)
        if not absent and not isinstance(value, bool):
            raise self._wrong(key, value, "true or false")
        return value

    def token_ids(self, key: str, vocab_size: int, single: bool = False):
        """A token id (single) or a token id / list of them, each in [0, vocab_size)."""
        value, absent = self._get(key, None)
        if absent:
            return None if single else []
        ids = value if isinstance(value, list) and not single else [value]
        for t in ids:
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab_size:
                raise self._wrong(key, value, f"{'a token id' if single else 'a token id or a list of them'}"
                                             f" in [0, {vocab_size})")
        return ids[0] if single else list(ids)
