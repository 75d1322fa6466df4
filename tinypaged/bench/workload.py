"""The benchmark's fixed workloads: real text cut into prompts of long-tailed lengths."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

TEXT = Path(__file__).resolve().parents[2] / "tests" / "data" / "prose.txt"
SYSTEM_TOPICS = ["rivers", "mountains", "the moon", "bread", "trains", "music", "bees", "glass",
                 "rain", "chess", "maps", "paper", "salt", "clocks", "bridges", "tea"]
INSTRUCTION = (
    "You are helping to prepare short study notes for a class of curious students. "
    "Each note should explain the topic in plain words, avoid jargon, give one concrete "
    "example from everyday life, mention one common misunderstanding and correct it, and "
    "end with a question that invites the student to think further. Keep the tone warm and "
    "encouraging, write in complete sentences, and do not use lists or headings. ") * 4


@dataclass(slots=True)
class Request:
    prompt_ids: list[int]
    output_len: int


def long_tailed_workload(tokenizer, n: int = 64, seed: int = 0, max_prompt: int = 512,
                         max_output: int = 256) -> list[Request]:
    """n requests whose prompt and output lengths are log-normal (medians ~67 and ~40
    tokens, long tails clipped at max_prompt / max_output). Prompts are the prose of
    tests/data/prose.txt, read cyclically from a different place each, so no two
    share a prefix by accident."""
    rng = np.random.default_rng(seed)
    prompt_lens = np.clip(rng.lognormal(4.2, 0.8, n).astype(int), 8, max_prompt)
    output_lens = np.clip(rng.lognormal(3.7, 0.8, n).astype(int), 8, max_output)
    text_ids = tokenizer.encode(TEXT.read_text(), add_special_tokens=False)
    ring = np.tile(text_ids, max_prompt // len(text_ids) + 2)
    starts = rng.integers(0, len(text_ids), n)
    return [Request([int(t) for t in ring[s:s + p]], int(o))
            for s, p, o in zip(starts, prompt_lens, output_lens)]


def prose_prompt(tokenizer, n_tokens: int) -> list[int]:
    """The first n_tokens of the prose, read cyclically."""
    text_ids = tokenizer.encode(TEXT.read_text(), add_special_tokens=False)
    return [int(t) for t in np.tile(text_ids, n_tokens // len(text_ids) + 1)[:n_tokens]]


def chat_requests(llm) -> list[str]:
    """16 chat prompts: the template's system prompt + a ~300-token instruction + a topic."""
    return [llm.chat_prompt([{"role": "user", "content": f"{INSTRUCTION}Topic: {t}."}])
            for t in SYSTEM_TOPICS]
