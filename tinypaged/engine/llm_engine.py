"""LLMEngine: requests in, one step at a time: schedule, run, sample, postprocess."""
from __future__ import annotations

import itertools
import os

from ..chat_template import given_template
from ..config import EngineConfig
from ..formats.gguf import parses_held
from ..kernels import get_backend
from ..model.paged_model import PagedKVCache
from ..outputs import RequestOutput
from ..sampling import SamplingParams
from ..structured.grammar import Grammars
from ..tokenizer import Tokenizer
from .block_manager import BlockManager
from .block_map import render_block_map
from .engine_stats import EngineStats
from .lora_adapters import LoRAAdapters
from .kv_pool import check_pool_fits, kv_cache_dtype, pool_blocks
from .model_loading import decode_graphs, start_loading
from .model_runner import ModelRunner
from .postprocessor import Postprocessor
from .request import PreparedRequest, Request
from .request_check import RequestCheck
from .sampler import Sampler
from .scheduler import Scheduler
from .speculation import Speculation
from .token_rules import TokenRules


class LLMEngine:
    def __init__(self, model_dir: str | os.PathLike, config: EngineConfig):
        self.config = config
        ops = get_backend(config.backend, config.gpu_weight_dtype)
        if config.cuda_graphs and ops.name != "cuda":
            raise ValueError(f"cuda_graphs=True needs the CUDA backend; this engine runs on "
                             f"{ops.name} (backend={config.backend!r})")
        with parses_held():  # (the tokenizer and the model read a GGUF's header once)
            loading = start_loading(model_dir, ops, config.max_model_len, config.layout_cache,
                                    config.quantization)
            try:
                self.tokenizer = Tokenizer(model_dir)  # (built while the weights load)
                if config.chat_template is not None:  # (in place of the model's)
                    self.tokenizer.chat_template = given_template(config.chat_template)
            finally:
                loaded = loading()
        model, self.model_config = loaded.model, loaded.config
        self.requantized, self.max_model_len = loaded.requantized, loaded.max_model_len
        cfg, bs = self.model_config, config.block_size
        self.kv_cache_dtype = kv_cache_dtype(config.kv_cache_dtype, cfg.dtype, cfg.head_dim, ops)
        bytes_per_block = PagedKVCache.bytes_per_block(cfg, bs, self.kv_cache_dtype)
        num_blocks = pool_blocks(config, bytes_per_block, self.max_model_len,
                                 ops.default_kv_memory, model.kv_groups)
        check_pool_fits(num_blocks, bytes_per_block, ops.memory_available())
        self.block_manager = BlockManager(num_blocks, bs, config.enable_prefix_caching,
                                          windows=model.kv_groups.windows)
        self.requests: dict[str, Request] = {}
        self.speculation = Speculation.of(config, self.max_model_len, self.block_manager, ops, self.tokenizer, cfg.vocab_size)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs,
                                   config.max_num_batched_tokens, self.requests, self.speculation)
        kv = PagedKVCache(cfg, num_blocks, bs, ops, self.kv_cache_dtype)
        self.runner = ModelRunner(model, kv, self.block_manager,
                                  decode_graphs(config, model, kv, self.max_model_len))
        self.loras = LoRAAdapters(cfg, ops, config, self.requests)
        self.runner.lora = self.loras if config.enable_lora else None
        unique = {id(w): w for w in model.w.values()}.values()  # a tied lm_head counts once
        self.weight_bytes = sum(int(w.nbytes) for w in unique)  # as the backend holds them
        self.backend_name = ops.name
        self.eos_token_ids = set(cfg.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            self.eos_token_ids.add(self.tokenizer.eos_token_id)
        # structured outputs: llguidance's tokenizer and compiled grammars, on first use
        self.grammars = Grammars(self.tokenizer, cfg.vocab_size, self.eos_token_ids,
                                 config.grammar_cache_memory)
        self.check = RequestCheck(self.tokenizer, cfg.vocab_size, self.max_model_len,
                                  config.max_num_seqs, self.block_manager, self.grammars)
        self.check.embedding_only = cfg.embedding_only
        self._ids = itertools.count()
        self.statistics = EngineStats(self.block_manager, self.speculation)
        self.sampler = Sampler(self.requests, self.grammars, self.scheduler)
        self.postprocessor = Postprocessor(self.requests, self.scheduler, self.statistics,
                                           self.eos_token_ids, self.max_model_len)

    # -- requests --------------------------------------------------------------
    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None) -> str:
        """Queue a request; raises ValueError (and queues nothing) for bad input."""
        return self.add_prepared(self.prepare_request(prompt, params), request_id)

    def prepare_request(self, prompt, params: SamplingParams | None = None,
                        lora: str | None = None) -> PreparedRequest:
        """RequestCheck.prepare (touches no engine state: any thread may call it)."""
        return self.check.prepare(prompt, params, lora)

    def prompt_ids(self, prompt: str | list[int]) -> list[int]:
        return self.check.prompt_ids(prompt)

    def add_prepared(self, prepared: PreparedRequest, request_id: str | None = None) -> str:
        request_id = str(next(self._ids)) if request_id is None else request_id
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        rules = TokenRules(prepared.params, self.tokenizer, self.eos_token_ids,
                           self.model_config.vocab_size)
        request = Request(request_id, prepared.prompt, prepared.prompt_token_ids, prepared.params,
                          self.tokenizer, prepared.grammar, rules, prepared.pooling)
        request.seqs[0].lora_slot, request.seqs[0].hash_seed = self.loras.resolve(prepared.lora)
        self.requests[request_id] = request
        self.scheduler.add(request.seqs[0])
        return request_id

    def abort(self, request_id: str) -> RequestOutput:
        """Stop a request now; its blocks go back to the pool. Returns its last output
        (unfinished samples end with finish_reason "abort")."""
        request = self.requests.pop(request_id, None)
        if request is None:
            raise ValueError(f"no request with id {request_id!r}")
        for seq in self.scheduler.abort(request.seqs):
            request.texts[seq.sample_index].finish()
        request.aborted = True
        return request.output()

    def use_in_this_thread(self) -> None:
        """Call first in a thread that will run steps (the engine loop's)."""
        self.runner.model.ops.use_in_this_thread()

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- the step ----------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, run, sample, postprocess; returns the requests that changed
        (finished ones for the last time: they are forgotten afterwards).

        A failure while running the batch fails the requests in it; a failure while
        sampling or postprocessing fails that request alone. Either way they come back
        finished, with finish_reason "error" and the exception in `error`, their
        blocks freed; the other requests go on (StepOutcome). An exception that
        escapes step() is a failure of the bookkeeping itself: the engine's state can
        no longer be trusted."""
        plan = self.scheduler.schedule()
        logits = self.runner.run(plan)
        drawn = self.sampler.sample(plan, logits)
        return self.postprocessor.postprocess(plan, drawn)

    # -- statistics ---------------------------------------------------------------------
    def block_map(self) -> str:
        """The pool now: one character per block, and every live sequence's block table."""
        return render_block_map(self.block_manager, self.scheduler.running)

    def stats(self) -> dict:
        """Pool, cache and token figures (EngineStats), with the bytes of the pool and
        of the weights (as the backend holds them), the matrices loading requantized
        (the file's kinds without a kernel of their own), and the preemptions so far."""
        return {**self.statistics.as_dict(), "kv_cache_bytes": self.runner.kv.nbytes,
                "weight_bytes": self.weight_bytes, "requantized": dict(self.requantized),
                "preemptions": self.scheduler.num_preemptions}
