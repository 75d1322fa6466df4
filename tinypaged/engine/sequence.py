"""Sequence: one stream of tokens being generated, and its block table."""
from __future__ import annotations

import enum
import itertools

import numpy as np

from ..model.lora_slots import NO_ADAPTER
from ..outputs import TokenLogprobs
from ..sampling import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # queued: never run, or preempted (its KV is recomputed)
    RUNNING = "running"
    FINISHED = "finished"


_next_seq_id = itertools.count()


class Sequence:
    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 sample_index: int = 0, rng: np.random.Generator | None = None):
        self.seq_id = next(_next_seq_id)
        self.request_id = request_id
        self.sample_index = sample_index  # which of the request's n samples
        self.token_ids: list[int] = list(prompt_token_ids)  # prompt, then output
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.rng = rng if rng is not None else sample_rng(params.seed, sample_index)
        # per KV group (model/kv_groups.py), logical block i -> physical block id; [] when
        # the sequence holds no blocks
        self.block_tables: list[list[int]] = []
        self.block_hashes: list[int] = []  # chained hash of each full block (BlockManager)
        self.num_computed_tokens = 0  # tokens whose K/V are in the pool
        self.num_cached_tokens = 0  # of those, found in the prefix cache on admission
        # every prompt row is computed, none taken from the prefix cache: prompt logprobs,
        # an embedding pooled over every token (pooled.py)
        self.every_row = params.prompt_logprobs is not None
        self.status = SequenceStatus.WAITING
        self.finish_reason: str | None = None
        self.logprobs: list[TokenLogprobs] = []  # per output token, when params.logprobs is set
        self.cumulative_logprob = 0.0
        # where the output stands in its grammar (structured/grammar.py); None: free. It
        # follows token_ids, which a preemption keeps, so recomputing leaves it valid
        self.grammar = None
        # speculation (speculation.py): the last num_drafts of token_ids are proposals
        # this step verifies, taken off again before anything else reads the tokens
        self.num_drafts = 0
        self.ngram_index = None  # its n-grams, for prompt-lookup proposals (ngram_proposer.py)
        self.acceptance = None  # its proposals' record (draft_sizer.py)
        self.draft_grammars = None  # its grammar's state before each proposal's row (speculation.py)
        self.lora_slot = NO_ADAPTER  # the LoRA slot its rows run (lora_adapters.py)
        self.hash_seed = None  # its first block's parent hash (an adapter's load id; None: the base)
        self.pooled = None  # an embedding's PooledState (pooled.py): prefilled, never decoded

    @property
    def block_table(self) -> list[int]:
        """The first KV group's table (the only one, unless the model mixes sliding and
        global layers)."""
        return self.block_tables[0] if self.block_tables else []

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    def add_drafts(self, tokens: list[int]) -> None:
        self.token_ids += tokens
        self.num_drafts += len(tokens)

    def drop_last_draft(self) -> None:
        self.token_ids.pop()
        self.num_drafts -= 1

    def take_drafts(self) -> list[int]:
        """The proposals, taken off token_ids ([] when there are none)."""
        n, self.num_drafts, self.draft_grammars = self.num_drafts, 0, None
        if n == 0:
            return []
        drafts = self.token_ids[-n:]
        del self.token_ids[-n:]
        return drafts

    def append_token(self, token_id: int, logprobs: TokenLogprobs | None = None) -> None:
        self.token_ids.append(token_id)
        if logprobs is not None:
            self.logprobs.append(logprobs)
            self.cumulative_logprob += logprobs.logprob

    def fork(self, sample_index: int) -> "Sequence":
        """A sibling that shares everything so far (the caller forks the block table)."""
        child = Sequence(self.request_id, self.token_ids[:self.num_prompt_tokens], self.params,
                         sample_index)
        child.token_ids = list(self.token_ids)
        child.num_computed_tokens = self.num_computed_tokens
        child.num_cached_tokens = self.num_cached_tokens
        child.status = self.status
        child.logprobs = list(self.logprobs)
        child.cumulative_logprob = self.cumulative_logprob
        child.grammar = self.grammar.fork() if self.grammar is not None else None
        child.lora_slot, child.hash_seed = self.lora_slot, self.hash_seed
        return child


def sample_rng(seed: int | None, sample_index: int) -> np.random.Generator:
    """The random stream of one sample: fixed by (seed, index), whatever else runs."""
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng([seed, sample_index])
