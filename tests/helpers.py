"""Test helpers: tiny random models and a byte-level tokenizer, written to disk
with the real safetensors / tokenizers writers."""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import numpy as np
from safetensors import TensorSpec, serialize_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from tinypaged.model.config import ModelConfig
from tinypaged.model.weights import expected_shapes

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a tiny test model.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he")]


def tiny_config_dict(arch: str = "LlamaForCausalLM", **overrides) -> dict:
    cfg = {
        "architectures": [arch], "vocab_size": 262, "hidden_size": 32,
        "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": False, "bos_token_id": 0,
        "eos_token_id": 2, "hidden_act": "silu",
    }
    cfg.update(overrides)
    return cfg


def random_weights(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Weights of every expected tensor; norms near 1, matrices scaled like an init."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in expected_shapes(cfg).items():
        if name.endswith("norm.weight"):
            weights[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        elif name.endswith(".bias"):
            weights[name] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            weights[name] = (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
    return weights


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounding to nearest even."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def write_safetensors(path: str, tensors: dict[str, np.ndarray], dtype: str = "F32") -> dict:
    """Write tensors as F32, F16 or BF16; return what a reader should get back (float32)."""
    arrays, expected = {}, {}
    for name, t in tensors.items():
        if dtype == "F32":
            arr = np.ascontiguousarray(t, dtype=np.float32)
            expected[name] = arr
        elif dtype == "F16":
            arr = np.ascontiguousarray(t, dtype=np.float16)
            expected[name] = arr.astype(np.float32)
        else:
            arr = to_bf16_bits(t)
            expected[name] = (arr.astype(np.uint32) << 16).view(np.float32)
        arrays[name] = arr
    names = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
    specs = {name: TensorSpec(dtype=names[dtype], shape=list(a.shape), data_ptr=a.ctypes.data,
                              data_len=a.nbytes) for name, a in arrays.items()}
    serialize_file(specs, path, metadata={"format": "pt"})
    return expected


def byte_level_tokenizer() -> Tokenizer:
    """A 256-byte + 3-merge + 3-special-token byte-level BPE (GPT-2 style), 262 ids."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab_list = SPECIAL_TOKENS + alphabet + ["".join(m) for m in MERGES]
    vocab = {tok: i for i, tok in enumerate(vocab_list)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=MERGES))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok


def write_tiny_model(model_dir: str, seed: int = 0, dtype: str = "F32",
                     arch: str = "LlamaForCausalLM", **overrides) -> dict[str, np.ndarray]:
    """A complete tiny model folder; returns the weights as the loader should see them."""
    os.makedirs(model_dir, exist_ok=True)
    cfg_dict = tiny_config_dict(arch, **overrides)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(cfg_dict, f)
    cfg = ModelConfig.from_dict(cfg_dict)
    expected = write_safetensors(os.path.join(model_dir, "model.safetensors"),
                                 random_weights(cfg, seed), dtype)
    byte_level_tokenizer().save(os.path.join(model_dir, "tokenizer.json"))
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "chat_template": CHATML_TEMPLATE}, f)
    return expected


def dense_greedy(model, prompt_ids: list[int], max_tokens: int, eos_ids=()) -> list[int]:
    """Greedy continuation by the dense reference forward (the oracle for the engine),
    an EOS in eos_ids ending it as its last token."""
    cache = model.new_cache(len(prompt_ids) + max_tokens)
    logits = model.forward(prompt_ids, cache, all_logits=False)[-1]
    out = []
    for _ in range(max_tokens):
        token = int(np.argmax(logits))
        out.append(token)
        if token in eos_ids:
            break
        if len(out) < max_tokens:
            logits = model.forward([token], cache)[-1]
    return out


class StepGate:
    """Holds the engine's steps while closed: a request that runs surely stays running
    however slow the machine, so a test that needs it to end late waits on events,
    never on time. reached is set once a step waits at the closed gate."""

    def __init__(self, llm, monkeypatch, closed: bool, seconds: float, close_when=None):
        """close_when(batch): the gate closes itself before a step for which it holds."""
        self.open_event, self.reached = threading.Event(), threading.Event()
        if not closed:
            self.open_event.set()
        real_run = llm.engine.runner.forward

        def gated_run(batch, rows=None, needs=None, pooled=None):
            if close_when is not None and close_when(batch):
                self.close()
            if not self.open_event.is_set():
                self.reached.set()
                self.open_event.wait()
            time.sleep(seconds)
            return real_run(batch, rows, needs, pooled)
        monkeypatch.setattr(llm.engine.runner, "forward", gated_run)

    def open(self) -> None:
        self.open_event.set()

    def close(self) -> None:
        self.open_event.clear()


def ctrl_c_while_waiting_for_output(thread: threading.Thread, timeout: float = 300.0,
                                    patience: float = 5.0) -> None:
    """Send SIGINT to thread (the main one) once it waits for a request's output, and
    again each time it is still waiting there `patience` seconds later: a signal can
    reach Python between the moment the wait's frame opens and the moment it blocks,
    and a collection run there (any library's __del__) drops the KeyboardInterrupt.
    A delivered one takes the thread out of the wait at once, so none is sent twice."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        wait_until_waiting_for_output(thread, deadline - time.monotonic())
        signal.pthread_kill(thread.ident, signal.SIGINT)
        left_at = time.monotonic() + patience
        while time.monotonic() < left_at:
            if not _waiting_for_output(thread):
                return
            time.sleep(0.01)
    raise AssertionError(f"{thread.name} never left its wait for output")


def _waiting_for_output(thread: threading.Thread) -> bool:
    frame = sys._current_frames().get(thread.ident)
    names = []
    while frame is not None and len(names) < 4:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return names[:2] == ["wait", "updates"]


def wait_until_waiting_for_output(thread: threading.Thread, timeout: float = 300.0) -> None:
    """Until thread is blocked waiting for a request's output (RequestStream.updates).
    A signal sent then interrupts that wait; one sent while the thread runs Python
    could land in whatever it runs, a collector's finalizer included, where Python
    drops it."""
    deadline = time.monotonic() + timeout
    while True:
        frame = sys._current_frames().get(thread.ident)
        names = []
        while frame is not None and len(names) < 4:
            names.append(frame.f_code.co_name)
            frame = frame.f_back
        if names[:2] == ["wait", "updates"]:
            return
        assert time.monotonic() < deadline, f"{thread.name} never waited for output: {names}"
        time.sleep(0.001)


def posted_aborts(llm, monkeypatch) -> list[str]:
    """The request ids whose abort is posted to llm's engine loop, as they are."""
    posted, real_abort = [], llm._loop.abort

    def abort(request_id):
        posted.append(request_id)
        real_abort(request_id)
    monkeypatch.setattr(llm._loop, "abort", abort)
    return posted


def step_gate(llm, monkeypatch, closed: bool = False, seconds: float = 0.003,
              close_when=None) -> StepGate:
    """slow_down, with a StepGate on the steps."""
    return StepGate(llm, monkeypatch, closed, seconds, close_when)


def slow_down(llm, monkeypatch, seconds: float = 0.003) -> None:
    """Every step takes a while, so that a long request is surely still running when
    a test cuts it off (stories260K decodes a token in ~0.1 ms)."""
    real_run = llm.engine.runner.forward

    def slow_run(batch, rows=None, needs=None, pooled=None):
        time.sleep(seconds)
        return real_run(batch, rows, needs, pooled)
    monkeypatch.setattr(llm.engine.runner, "forward", slow_run)


def pooled_beside_generation(fresh, params, add_pooled) -> tuple[dict, int]:
    """A generation of [5, 6, 7] run alone on fresh() (an engine), then on another with
    the pooled requests add_pooled(engine) adds after its prompt (their ids returned):
    in every step they run in, the generation decodes a token too, and its tokens are
    those it had alone; every block goes back. Returns ({id: its vector}, the steps
    they ran in)."""
    plain = fresh()
    plain.add_request([5, 6, 7], params, "g")
    while plain.has_unfinished():
        outs = plain.step()
    want_tokens = outs[0].outputs[0].token_ids
    engine = fresh()
    engine.add_request([5, 6, 7], params, "g")
    engine.step()  # (its prompt)
    names = add_pooled(engine)
    vectors, together = {}, 0
    while engine.has_unfinished():
        pooling = any(name in engine.requests for name in names)
        outs = {o.request_id: o for o in engine.step()}
        if pooling:
            together += 1
            assert "g" in outs and not outs["g"].finished
        vectors.update({name: outs[name].embedding for name in names if name in outs and outs[name].finished})
        if "g" in outs and outs["g"].finished:
            assert outs["g"].outputs[0].token_ids == want_tokens
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    return vectors, together
