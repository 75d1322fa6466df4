"""Draft-model proposals (speculative_config method "draft_model"): a second, smaller or
lower-bit model of the same tokenizer proposes each sequence's next tokens greedily.

The draft keeps its own paged KV pool and block manager (no prefix cache: its blocks
are never shared), and for each target sequence a DraftSlots: its block table and how
many of the sequence's tokens its K/V hold. A proposal first catches the draft up on
the tokens the target took since (its accepted proposals, the target's own token), in
one forward pass over all sequences, then runs one pass a further proposal. After the
target's verification, rollback keeps only the K/V of tokens the target kept. A
finished sequence's slots go back at the next proposal; a preempted one's are kept
(its tokens are).
"""
from __future__ import annotations

import os

import numpy as np

from ..batch.attention_metadata import AttentionMetadata
from ..formats.gguf import parses_held
from ..model.paged_model import PagedKVCache, PagedModel
from ..tokenizer import Tokenizer
from .block_manager import BlockManager
from .kv_pool import check_pool_fits, kv_cache_dtype
from .model_loading import load_paged_model
from .sequence import Sequence


class DraftSlots:
    """A sequence's place in the draft's pool (what BlockManager reads of a sequence)."""

    def __init__(self):
        self.block_tables: list[list[int]] = []
        self.num_computed_tokens = self.num_cached_tokens = 0
        self.length = 0  # tokens the tables hold slots for

    def __len__(self) -> int:
        return self.length


class DraftProposer:
    def __init__(self, model: PagedModel, kv: PagedKVCache, block_manager: BlockManager,
                 context: int):
        """context: the positions the draft runs to (its own limit or the target's)."""
        self.model, self.kv, self.block_manager = model, kv, block_manager
        self.context = context
        self.slots: dict[Sequence, DraftSlots] = {}

    @classmethod
    def load(cls, path: str | os.PathLike, ops, target_tokenizer: Tokenizer,
             target_vocab: int, max_model_len: int, num_blocks: int, block_size: int,
             kv_dtype_choice: str, layout_cache: bool = True) -> "DraftProposer":
        """The draft model at path on the target's backend, refused by name where its
        tokenizer is not the target's (vocab size or any token's string); loaded as the
        target is (model_loading.py), its prepared layout kept beside a GGUF."""
        with parses_held():  # (its tokenizer and its model read a GGUF's header once)
            check_same_tokenizer(path, Tokenizer(path), target_tokenizer)
            loaded = load_paged_model(path, ops, max_model_len, layout_cache)
        model, cfg = loaded.model, loaded.config
        if cfg.vocab_size != target_vocab:
            raise ValueError(f"speculative_config model {str(path)!r}: its vocab_size is "
                             f"{cfg.vocab_size}, the target's {target_vocab}")
        dtype = kv_cache_dtype(kv_dtype_choice, cfg.dtype, cfg.head_dim, ops)
        check_pool_fits(num_blocks, PagedKVCache.bytes_per_block(cfg, block_size, dtype),
                        ops.memory_available())
        kv = PagedKVCache(cfg, num_blocks, block_size, ops, dtype)
        manager = BlockManager(num_blocks, block_size, enable_prefix_caching=False,
                               windows=model.kv_groups.windows)
        return cls(model, kv, manager, loaded.max_model_len)

    def propose_all(self, seqs: list[Sequence], limits: list[int]) -> list[list[int]]:
        """Up to limits[i] greedy proposals for each of seqs (none where the draft's pool
        has no room for them)."""
        self._forget_finished()
        proposals = [[] for _ in seqs]
        limits = [min(limit, self.context + 1 - len(seq)) for seq, limit in zip(seqs, limits)]
        live = [(i, seq, limit) for i, (seq, limit) in enumerate(zip(seqs, limits))  # (each at most num_speculative_tokens)
                if limit > 0 and self._reserve(seq, len(seq) + limit - 1)]
        # the first pass: each sequence's tokens the draft has not read, its last among them
        spans = [(self.slots[seq], self.slots[seq].num_computed_tokens, len(seq)) for _, seq, _ in live]
        tokens = [seq.token_ids[start:end] for (_, seq, _), (_, start, end) in zip(live, spans)]
        for step in range(max((n for _, _, n in live), default=0)):
            drawn = self._greedy(tokens, spans)
            for (i, _, _), token in zip(live, drawn):
                proposals[i].append(token)
            keep = [j for j, (_, _, n) in enumerate(live) if n > step + 1]
            live = [live[j] for j in keep]
            tokens = [[int(drawn[j])] for j in keep]
            spans = [(spans[j][0], spans[j][2], spans[j][2] + 1) for j in keep]
        return proposals

    def rollback(self, seq: Sequence, kept: int) -> None:
        """The target kept its first `kept` tokens' K/V (the last token and the accepted
        proposals): the draft keeps no more than those."""
        slots = self.slots.get(seq)
        if slots is not None:
            slots.num_computed_tokens = min(slots.num_computed_tokens, kept)
            slots.length = slots.num_computed_tokens
            self.block_manager.truncate(slots, slots.length)

    def _reserve(self, seq: Sequence, tokens: int) -> bool:
        """Slots in the draft's pool for seq's first `tokens` tokens."""
        slots = self.slots.get(seq)
        if slots is None:
            slots = DraftSlots()
            slots.length = tokens
            if not self.block_manager.can_allocate(slots):
                return False
            self.block_manager.allocate(slots)
            self.slots[seq] = slots
            return True
        while slots.length < tokens:
            slots.length += 1
            if not self.block_manager.can_append(slots):
                slots.length -= 1
                return False
            self.block_manager.append_slot(slots)
        return True

    def _greedy(self, tokens: list[list[int]], spans: list[tuple[DraftSlots, int, int]]) -> list[int]:
        """One forward pass of the draft over each span's tokens (positions start .. end);
        the argmax after each span's last token. The spans' K/V stay in the draft's pool."""
        meta = AttentionMetadata.build_grouped([(s.block_tables, start, end) for s, start, end in spans],
                                               self.block_manager.block_size)
        logits = self.model.forward(np.concatenate([np.asarray(t, np.int64) for t in tokens]), meta, self.kv)
        for slots, _, end in spans:
            slots.num_computed_tokens = end
        return [int(i) for i in np.argmax(logits, axis=1)]

    def _forget_finished(self) -> None:
        for seq in [s for s in self.slots if s.is_finished]:
            self.block_manager.free(self.slots.pop(seq))


def check_same_tokenizer(path, draft: Tokenizer, target: Tokenizer) -> None:
    """ValueError naming the first difference between the two tokenizers' vocabularies."""
    mine, theirs = draft.vocab(), target.vocab()
    if len(mine) != len(theirs):
        raise ValueError(f"speculative_config model {str(path)!r}: its tokenizer has {len(mine)} "
                         f"tokens, the target's {len(theirs)}: a draft must share the target's tokenizer")
    by_id = {i: t for t, i in theirs.items()}
    for token, i in sorted(mine.items(), key=lambda item: item[1]):
        if by_id.get(i) != token:
            raise ValueError(f"speculative_config model {str(path)!r}: its token {i} is {token!r}, "
                             f"the target's {by_id.get(i)!r}: a draft must share the target's tokenizer")
