"""A model's weights as a dict: HF tensor name -> ndarray or PackedWeight, where one
object may stand under two names (a tied lm_head is the embedding itself)."""
from __future__ import annotations

import re

# a layer's tensor name: group 1 its prefix ("model.layers.7."), group 2 its index
LAYER_NAME = re.compile(r"^(model\.layers\.(\d+)\.)")


def convert_matrices(weights: dict, convert) -> dict:
    """The weights with each matrix m that convert(m) takes (not None) replaced by
    convert(m), once per matrix object (a tied lm_head stays the embedding's own).
    Takes the dict over: it is emptied as it goes, so each original can be freed as
    soon as its converted form exists (the peak holds one of them, not the model)."""
    done: dict[int, object] = {}  # id(original) -> its converted form
    out = {}
    for name in list(weights):
        w = weights.pop(name)
        if id(w) not in done:
            done[id(w)] = convert(w)
        out[name] = w if done[id(w)] is None else done[id(w)]
    return out
