"""What a prompt may be, and how a call's prompts argument becomes a list of them.

One prompt is text (str), token ids (a list or tuple of integers, or a 1-D NumPy
integer array), or vLLM's dict form ({"prompt": text} or {"prompt_token_ids": ids}).
Anything else is a TypeError naming the prompt, before any work starts.
"""
from __future__ import annotations

import numpy as np

from . import checks

Prompt = str | list[int]


def is_single_prompt(prompts) -> bool:
    """True for one prompt, False for a list (or other sequence) of prompts."""
    if isinstance(prompts, (str, dict)):
        return True
    if isinstance(prompts, np.ndarray):
        return prompts.ndim == 1
    if isinstance(prompts, (list, tuple)):
        return bool(prompts) and checks.is_integer(prompts[0])
    return True  # not a container of prompts: checked (and refused) as one prompt


def as_prompt_list(prompts) -> list[Prompt]:
    """One prompt or a list of them -> a list of checked prompts."""
    if is_single_prompt(prompts):
        return [normalize_prompt(prompts, "prompt")]
    if isinstance(prompts, np.ndarray):
        if prompts.ndim != 2:
            raise ValueError(f"an array of token ids must be 1-D (one prompt) or 2-D (one "
                             f"prompt per row), got {prompts.ndim}-D")
        prompts = list(prompts)
    many = len(prompts) > 1
    return [normalize_prompt(p, f"prompt {i}" if many else "prompt")
            for i, p in enumerate(prompts)]


def normalize_prompt(prompt, name: str = "prompt") -> Prompt:
    """A checked prompt: str, or a list of plain int token ids (range checked later,
    against the model's vocabulary)."""
    if isinstance(prompt, dict):
        return _from_dict(prompt, name)
    if isinstance(prompt, str):
        return checks.text(name, prompt)
    if isinstance(prompt, np.ndarray):
        if prompt.ndim != 1 or not np.issubdtype(prompt.dtype, np.integer):
            raise TypeError(f"{name}: an array of token ids must be 1-D with an integer dtype, "
                            f"got {prompt.ndim}-D {prompt.dtype}")
        return [int(t) for t in prompt]
    if isinstance(prompt, (list, tuple)):
        for i, t in enumerate(prompt):
            if not checks.is_integer(t):
                raise TypeError(f"{name}: token ids must be integers, but item {i} is "
                                f"{t!r} ({type(t).__name__})")
        return [int(t) for t in prompt]
    raise TypeError(f"{name} must be text (str) or token ids (a list of int), got "
                    f"{checks.describe(prompt)}")


def _from_dict(prompt: dict, name: str) -> Prompt:
    keys = set(prompt)
    if keys == {"prompt"}:
        return checks.text(name, prompt["prompt"])
    if keys == {"prompt_token_ids"}:
        ids = prompt["prompt_token_ids"]
        if isinstance(ids, (str, dict)):
            raise TypeError(f"{name}: prompt_token_ids must be a list of int")
        return normalize_prompt(ids, name)
    raise TypeError(f"{name}: a dict prompt has exactly one key, 'prompt' (text) or "
                    f"'prompt_token_ids' (a list of int); got keys {sorted(map(str, keys))}")
