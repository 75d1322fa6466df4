"""Rope: how a model turns positions into rotation angles, read from either config
layout (transformers >= 5 `rope_parameters`, older `rope_theta` + `rope_scaling`)
or from GGUF metadata, and checked: an unknown kind or parameter is refused by
name rather than run as plain RoPE.

The angle of pair i at position p is p * inv_freq[i]; cos and sin are then scaled
by attention_factor (YaRN's "mscale", 1 for the other kinds). The kinds, as
transformers computes them (modeling_rope_utils.py):
  default  inv_freq[i] = theta^(-2i/D)
  linear   inv_freq / factor (positions interpolated)
  llama3   long wavelengths divided by factor, short ones kept, a smooth ramp between
           (low_freq_factor, high_freq_factor over original_max_position_embeddings)
  yarn     the same idea per dimension, with a linear ramp between beta_fast and
           beta_slow rotations, and cos/sin scaled by 0.1 ln(factor) + 1
GGUF files store Llama 3's scaling as a tensor, rope_freqs.weight: inv_freq[i] /
freq_factors[i] (freq_factors).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ROPE_TYPES = ("default", "linear", "llama3", "yarn")
# the parameters each kind reads (beyond rope_type/type and rope_theta)
PARAMETERS = {
    "default": set(),
    "linear": {"factor"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
    "yarn": {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
             "attention_factor", "mscale", "mscale_all_dim", "truncate"},
}
REFUSED_KINDS = {
    "dynamic": "dynamic NTK scaling changes the frequencies with the sequence length",
    "longrope": "LongRoPE (Phi-3's long-context scaling)",
    "su": "LongRoPE (Phi-3's long-context scaling)",
    "proportional": "proportional RoPE",
}


@dataclass(frozen=True, slots=True)
class Rope:
    theta: float = 10000.0
    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float = 1.0
    truncate: bool = True
    freq_factors: tuple[float, ...] | None = None  # GGUF rope_freqs.weight, (D/2,)

    def inv_freq(self, head_dim: int) -> np.ndarray:
        """(D/2,) float64: the angle a position adds to each rotated pair."""
        if self.kind == "none":  # a layer without RoPE: no pair turns
            return np.zeros(head_dim // 2)
        exponents = np.arange(0, head_dim, 2, dtype=np.float64) / head_dim
        base = self.theta ** (-exponents)
        if self.kind == "linear":
            base = base / self.factor
        elif self.kind == "llama3":
            base = self._llama3(base)
        elif self.kind == "yarn":
            base = self._yarn(base, head_dim)
        if self.freq_factors is not None:
            if len(self.freq_factors) != head_dim // 2:
                raise ValueError(f"rope_freqs holds {len(self.freq_factors)} factors, the heads "
                                 f"rotate {head_dim // 2} pairs")
            base = base / np.asarray(self.freq_factors, dtype=np.float64)
        return base

    def _llama3(self, inv_freq: np.ndarray) -> np.ndarray:
        old = self.original_max_positions
        low_wavelen, high_wavelen = old / self.low_freq_factor, old / self.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / self.factor, inv_freq)
        smooth = (old / wavelen - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
        smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(medium, smoothed, scaled)

    def _yarn(self, inv_freq: np.ndarray, head_dim: int) -> np.ndarray:
        def correction_dim(rotations: float) -> float:
            return (head_dim * math.log(self.original_max_positions / (rotations * 2 * math.pi))
                    / (2 * math.log(self.theta)))
        low, high = correction_dim(self.beta_fast), correction_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, head_dim - 1)
        if low == high:
            high += 0.001  # as transformers: no division by zero
        ramp = np.clip((np.arange(head_dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        extrapolated = 1 - ramp  # 1: the pair keeps its frequency; 0: interpolated
        return inv_freq / self.factor * (1 - extrapolated) + inv_freq * extrapolated


NO_ROPE = Rope(kind="none")  # (not a kind a config may name: layers that skip RoPE)


def yarn_attention_factor(factor: float, mscale: float | None, mscale_all_dim: float | None) -> float:
    def get(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
    if mscale and mscale_all_dim:
        return get(factor, mscale) / get(factor, mscale_all_dim)
    return get(factor)


def rope_from_parameters(params: dict, where: str, max_position_embeddings: int,
                         key: str = "rope_parameters") -> Rope:
    """A Rope from a standardized parameter dict (rope_type, rope_theta, ...): every
    key read or refused by name; `key` names the dict in messages."""
    kind = params.get("rope_type", params.get("type", "default"))
    if kind in REFUSED_KINDS:
        raise ValueError(f"{where}: {key} rope_type={kind!r} ({REFUSED_KINDS[kind]}) is not supported")
    if kind not in ROPE_TYPES:
        raise ValueError(f"{where}: {key} rope_type={kind!r} is not a RoPE kind tinypaged knows "
                         f"(known: {', '.join(ROPE_TYPES)})")
    unknown = set(params) - PARAMETERS[kind] - {"rope_type", "type", "rope_theta"}
    # transformers writes partial_rotary_factor 1.0 into some configs: a no-op
    if params.get("partial_rotary_factor", 1.0) == 1.0:
        unknown.discard("partial_rotary_factor")
    if unknown:
        raise ValueError(f"{where}: {key} has {', '.join(sorted(map(repr, unknown)))}, which "
                         f"rope_type={kind!r} does not use here: refused rather than ignored")

    def number(name: str, default=None, positive: bool = True) -> float:
        value = params.get(name, default)
        if value is None:
            raise ValueError(f"{where}: {key} rope_type={kind!r} needs {name!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or (positive and value <= 0):
            raise ValueError(f"{where}: {key} {name}={value!r} must be a "
                             f"{'positive' if positive else 'finite'} number")
        return float(value)

    theta = number("rope_theta", 10000.0)
    if kind == "default":
        return Rope(theta)
    factor = number("factor")
    if kind == "linear":
        return Rope(theta, kind, factor)
    original = int(number("original_max_position_embeddings", max_position_embeddings))
    if kind == "llama3":
        low, high = number("low_freq_factor"), number("high_freq_factor")
        if high <= low:
            raise ValueError(f"{where}: {key} high_freq_factor={high:g} must exceed "
                             f"low_freq_factor={low:g}")
        return Rope(theta, kind, factor, low, high, original)
    truncate = params.get("truncate", True)
    if not isinstance(truncate, bool):
        raise ValueError(f"{where}: {key} truncate={truncate!r} must be true or false")
    mscale = number("mscale", 0.0, positive=False) or None
    mscale_all_dim = number("mscale_all_dim", 0.0, positive=False) or None
    attention = params.get("attention_factor")
    attention = number("attention_factor") if attention is not None else \
        yarn_attention_factor(factor, mscale, mscale_all_dim)
    return Rope(theta, kind, factor, original_max_positions=original,
                beta_fast=number("beta_fast", 32.0), beta_slow=number("beta_slow", 1.0),
                attention_factor=attention, truncate=truncate)


def rope_from_config(cfg: dict, where: str, max_position_embeddings: int) -> Rope:
    """The Rope of a config.json in either layout: `rope_parameters` (transformers >= 5;
    one dict for every layer) or `rope_theta` + `rope_scaling` (older)."""
    new, old = cfg.get("rope_parameters"), cfg.get("rope_scaling")
    if new is not None and old is not None:
        raise ValueError(f"{where}: both rope_parameters and rope_scaling are set; which one "
                         f"holds is unclear")
    params = new if new is not None else old
    key = "rope_parameters" if new is not None else "rope_scaling"
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ValueError(f"{where}: {key} must be an object, got {params!r}")
    params = dict(params)
    if any(isinstance(v, dict) for v in params.values()):
        raise ValueError(f"{where}: {key} holds a RoPE setting per layer type "
                         f"({', '.join(repr(k) for k, v in params.items() if isinstance(v, dict))}), "
                         f"which this architecture does not have")
    theta = cfg.get("rope_theta")
    if theta is not None:
        if "rope_theta" in params and params["rope_theta"] != theta:
            raise ValueError(f"{where}: rope_theta={theta!r} disagrees with {key}'s "
                             f"rope_theta={params['rope_theta']!r}")
        params.setdefault("rope_theta", theta)
    kind = params.get("rope_type", params.get("type", "default"))
    if "original_max_position_embeddings" in cfg and kind in ("llama3", "yarn", "longrope"):
        # Phi-3 keeps it beside the scaling, not inside; transformers lets it win
        params["original_max_position_embeddings"] = cfg["original_max_position_embeddings"]
    return rope_from_parameters(params, where, max_position_embeddings, key)
