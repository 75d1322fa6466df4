"""Row stacks: the matrices a layer multiplies by the same x (q, k and v; gate and
up) held as one matrix, so that a step makes one kernel call for them, not three.

At batch 1 a layer's seven products are numba calls of 10-60 us each, and each
pays a few us of Python around it (dispatch, checks, the output's allocation);
stacked, a layer makes four. Each original matrix stays in the weights under its
own name as StackRows (stack_rows.py): its rows of the stack, so it can still be
multiplied on its own, and the weights' bytes are counted once.
"""
from __future__ import annotations

import numpy as np

from ...formats.packed import PackedWeight
from ...formats.weight_dict import LAYER_NAME
from .linear import LinearWeight, linear
from .stack_rows import StackRows

STACKED = (("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
           ("mlp.gate_proj.weight", "mlp.up_proj.weight"))


def _same_format(parts: list) -> bool:
    first = parts[0]
    return isinstance(first, (PackedWeight, LinearWeight)) and all(
        type(p) is type(first) and p.shape[1] == first.shape[1] and p.kind is first.kind for p in parts)


def stack_view(weight, start: int, stop: int) -> LinearWeight:
    """A view of rows start .. stop - 1 of a LinearWeight stack."""
    return LinearWeight.of(weight.kind, weight.data[start:stop])


def _stack(parts: list) -> list:
    """The parts as views of one matrix that holds their rows in order. A packed stack's
    views have no form of their own: it is laid out next (lanes.py), and a view's
    product is then a slice of the stack's."""
    if isinstance(parts[0], PackedWeight):
        stack = PackedWeight.concatenate(parts)
    else:
        stack = LinearWeight.of(parts[0].kind, np.concatenate([p.data for p in parts]))
    views, start = [], 0
    for p in parts:
        stop = start + p.shape[0]
        own = stack_view(stack, start, stop) if isinstance(stack, LinearWeight) else None
        views.append(StackRows(stack, start, stop, own))
        start = stop
    return views


def stack_layer_matrices(weights: dict) -> dict:
    """The weights with each layer's q/k/v and gate/up stacked, each group's longest
    first run of one format (kind or quant type) and one width: q/k/v, or q/k where
    v has a kind of its own (Q4_K_M's Q6_K v in a third of the layers). Updates the
    dict in place (one group's originals and stack are alive at a time) and returns it."""
    out = weights
    layers = {m.group(1) for name in weights if (m := LAYER_NAME.match(name))}
    for prefix in layers:
        for group in STACKED:
            names = [prefix + n for n in group]
            parts = [out.get(n) for n in names]
            if any(p is None for p in parts):
                continue
            run = len(parts)
            while run >= 2 and not _same_format(parts[:run]):
                run -= 1
            if run >= 2:
                out.update(zip(names[:run], _stack(parts[:run])))
    return out


def whole_stack(parts: list):
    """The stack whose rows the parts are, all of them and in order; else None."""
    stacks = [p.stack if isinstance(p, StackRows) else None for p in parts]
    if not all(stacks) or stacks[0][1] != 0 or stacks[-1][2] != stacks[0][0].shape[0]:
        return None
    return stacks[0][0] if all(a[0] is stacks[0][0] and a[2] == b[1] for a, b in zip(stacks, stacks[1:])) \
        else None


def stacked_linear(x: np.ndarray, parts: list, ahead=None) -> list[np.ndarray]:
    """[x @ p.T for p in parts]: one product for the first parts that make a whole
    stack (all of them, or q and k), then one product each; the first product hints
    ahead (reference.linear)."""
    for run in range(len(parts), 1, -1):
        whole = whole_stack(parts[:run])
        if whole is not None:
            out = linear(x, whole, ahead=ahead)
            return [np.ascontiguousarray(out[:, p.stack[1]:p.stack[2]]) for p in parts[:run]] + \
                [linear(x, p) for p in parts[run:]]
    return [linear(x, parts[0], ahead=ahead)] + [linear(x, p) for p in parts[1:]]
