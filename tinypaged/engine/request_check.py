"""RequestCheck: a request checked and its prompt tokenized before it joins the engine:
everything wrong with it is a TypeError or ValueError naming the problem, and a
request that fails here leaves no trace. It reads only what does not change while
the engine runs (the tokenizer, the model's limits, the pool's size), so any thread
may check while the engine loop steps."""
from __future__ import annotations

from ..prompts import normalize_prompt
from ..sampling import SamplingParams
from ..structured.grammar import Grammars
from ..tokenizer import Tokenizer
from .block_manager import BlockManager, blocks_for
from .request import PreparedRequest


class RequestCheck:
    def __init__(self, tokenizer: Tokenizer, vocab_size: int, max_model_len: int, max_num_seqs: int,
                 block_manager: BlockManager, grammars: Grammars):
        self.tokenizer, self.vocab_size, self.max_model_len = tokenizer, vocab_size, max_model_len
        self.max_num_seqs, self.block_manager, self.grammars = max_num_seqs, block_manager, grammars
        self.embedding_only = False  # a bare base model: embeddings only (ModelConfig's)

    def prepare(self, prompt, params: SamplingParams | None = None,
                lora: str | None = None) -> PreparedRequest:
        """Check a request and tokenize its prompt, touching no engine state (so any
        thread may call it). Raises TypeError or ValueError naming what is wrong. The
        request keeps its own checked copy of params (SamplingParams.checked)."""
        if self.embedding_only:
            raise ValueError("this is an embedding model (a bare base model, without an "
                             "lm_head): it embeds (LLM.embed, /v1/embeddings) and does not "
                             "generate")
        if lora is not None and not isinstance(lora, str):
            raise TypeError(f"lora must be an adapter's name (a str), got {type(lora).__name__}")
        if params is None:
            params = SamplingParams()
        elif not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        else:
            params = params.checked()  # catches fields changed after construction
        prompt = normalize_prompt(prompt)
        ids = self.prompt_ids(prompt)
        if params.n > self.max_num_seqs:
            raise ValueError(f"n={params.n} exceeds max_num_seqs={self.max_num_seqs}")
        vocab = self.vocab_size
        for name, tokens in (("logit_bias", params.logit_bias), ("stop_token_ids", params.stop_token_ids),
                             ("allowed_token_ids", params.allowed_token_ids or [])):
            bad = [t for t in tokens if not 0 <= t < vocab]
            if bad:
                raise ValueError(f"{name}: token id {bad[0]} is out of range [0, {vocab})")
        grammar = None
        if params.structured_outputs is not None:  # compiled here: a bad one queues nothing
            grammar = self.grammars.compile(params.structured_outputs)
        return PreparedRequest(prompt if isinstance(prompt, str) else None, ids, params, grammar, lora)

    def prompt_ids(self, prompt: str | list[int]) -> list[int]:
        """A normalized prompt's token ids (see prompts.normalize_prompt), checked against
        the vocabulary, max_model_len and the pool."""
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty: give at least one character of text")
            ids = self.tokenizer.encode(prompt, max_model_len=self.max_model_len)
        else:
            ids = list(prompt)
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"prompt token id {bad[0]} is out of range "
                                 f"[0, {self.vocab_size})")
        if not ids:
            raise ValueError("prompt is empty: it encodes to no tokens")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"prompt has {len(ids)} tokens; max_model_len is "
                             f"{self.max_model_len} tokens, leaving no room to generate")
        # admission takes the prompt's blocks and the first output token's, in every KV group
        need = self.block_manager.num_groups * blocks_for(len(ids) + 1, self.block_manager.block_size)
        if need > self.block_manager.num_blocks:
            raise ValueError(f"prompt of {len(ids)} tokens needs {need} KV blocks; the pool "
                             f"has only {self.block_manager.num_blocks}")
        return ids
