"""Tokenizer: a model's vocabulary (a HF `tokenizer.json` through `tokenizers`; a
GGUF's SentencePiece vocabulary by formats/sentencepiece_bpe.py, any other GGUF one
rebuilt as a `tokenizers` one), the model's chat template (chat_template.py renders
it), and incremental detokenisation for streaming."""
from __future__ import annotations

import json
import os
import re

from . import checks
from .chat_template import render
from .formats.hf_tokens import HFTokens

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_chars() -> dict[str, int]:
    """GPT-2's byte-level alphabet: each byte is shown as one printable character
    (printable Latin-1 bytes as themselves, the others as U+0100 onwards)."""
    keep = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def _read_json(path: str) -> dict:
    """A JSON object from path; any problem is a ValueError naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: invalid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _special_token(config: dict, key: str, where: str) -> str | None:
    value = config.get(key)
    value = value.get("content") if isinstance(value, dict) else value  # HF allows an AddedToken dict
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{where}: {key} must be a string, got {value!r}")
    return value


def _check_message(i: int, message: dict) -> None:
    """A message as chat templates take it: a role, and content that is text, a list
    of parts ({"type": ..., ...}), or absent (an assistant's tool calls)."""
    role, content = message.get("role"), message.get("content")
    if not isinstance(role, str) or not role:
        raise ValueError(f"message {i} needs a 'role' (a string), got {message!r:.200}")
    if isinstance(content, str):
        checks.text(f"message {i} content", content)
    elif isinstance(content, list):
        for j, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise ValueError(f"message {i} content part {j} must be {{'type': ..., ...}}, "
                                 f"got {part!r:.200}")
            if part["type"] == "text":
                checks.text(f"message {i} content part {j} text", part.get("text"))
    elif content is not None or "tool_calls" not in message:
        raise ValueError(f"message {i} content must be text or a list of parts, got "
                         f"{type(content).__name__}")


def _from_folder(model_dir: str) -> tuple[HFTokens, dict, str]:
    """tokenizer.json and tokenizer_config.json of a HF model folder."""
    from tokenizers import Tokenizer as HFTokenizer

    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"tokenizer not found: {path}")
    try:
        tok = HFTokenizer.from_file(path)
    except Exception as e:  # the Rust side raises a bare Exception on bad JSON
        raise ValueError(f"{path}: cannot load tokenizer ({e})") from None
    config_path = os.path.join(model_dir, "tokenizer_config.json")
    return HFTokens(tok), _read_json(config_path) if os.path.isfile(config_path) else {}, config_path


def _from_gguf(path: str):
    """The vocabulary, merges and chat template a GGUF file carries."""
    from .formats.gguf import GGUFFile
    from .formats.gguf_vocab import tokenizer_config
    from .formats.sentencepiece_bpe import SentencePieceBPE, SentencePieceMisfit
    gguf = GGUFFile.open(path)
    config = tokenizer_config(gguf)
    if gguf.get("tokenizer.ggml.model") == "llama":
        try:
            return SentencePieceBPE.from_gguf(gguf), config, path
        except SentencePieceMisfit:
            pass  # (the `tokenizers` form, which reads such a vocabulary its own way)
    from .formats.gguf_tokenizer import build_tokenizer  # (imports `tokenizers`)
    return HFTokens(build_tokenizer(gguf)), config, path


class Tokenizer:
    def __init__(self, model_path: str | os.PathLike):
        """model_path: a HF model folder, or a GGUF file."""
        model_path = os.fspath(model_path)
        is_gguf = model_path.lower().endswith(".gguf")
        # (HFTokens or SentencePieceBPE: the same questions answered)
        self._tok, config, config_path = (_from_gguf if is_gguf else _from_folder)(model_path)
        self._byte_level = _byte_level_chars() if self._tok.byte_level else None
        self._special_ids = self._tok.special_ids
        self.chat_template = config.get("chat_template")
        if self.chat_template is not None and not isinstance(self.chat_template, str):
            raise ValueError(f"{config_path}: chat_template must be a string (a list of "
                             f"named templates is not supported)")
        self.bos_token = _special_token(config, "bos_token", config_path)
        self.eos_token = _special_token(config, "eos_token", config_path)
        self.eos_token_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        self._longest_token_bytes = None  # (check_fits: measured on first use)

    @property
    def special_tokens(self) -> set[str]:
        """The text of every special (added) token."""
        return {self._tok.id_to_token(i) for i in self._special_ids}

    @property
    def vocab_size(self) -> int:
        return self._tok.vocab_size

    def vocab(self) -> dict[str, int]:
        """Every token's string -> its id, added tokens included."""
        return self._tok.vocab_dict()

    def json_text(self) -> str:
        """The whole tokenizer as tokenizer.json text (what llguidance reads)."""
        return self._tok.json_text()

    def encode(self, text: str, add_special_tokens: bool = True,
               max_model_len: int | None = None) -> list[int]:
        """Token ids of text; a str with lone surrogates is a ValueError (checks.text).
        A long text is encoded without the GIL (other threads run meanwhile). Given
        max_model_len, a text too long to leave room for a token is refused from its
        size before it is tokenized (check_fits)."""
        self.check_fits(checks.text("prompt", text), max_model_len)
        return self._ids(text, add_special_tokens)

    def check_fits(self, text: str, max_model_len: int | None) -> None:
        """ValueError where text surely has max_model_len tokens or more: no token
        stands for more of a text than its vocabulary's longest token (text_bytes_bound),
        so its bytes bound its
        tokens from below, at the cost of measuring them (a 3 MB text took 2-7 s to
        tokenize before the length refused it)."""
        if max_model_len is None or len(text) < max_model_len:
            return
        if self._longest_token_bytes is None:  # (once: the vocabulary's strings)
            self._longest_token_bytes = self._tok.text_bytes_bound()
        size = len(text.encode("utf-8"))
        fewest = size // self._longest_token_bytes
        if fewest >= max_model_len:
            raise ValueError(f"prompt has at least {fewest} tokens ({size} bytes of text); "
                             f"max_model_len is {max_model_len} tokens, leaving no room to "
                             f"generate")

    def _ids(self, text: str, add_special_tokens: bool) -> list[int]:
        return self._tok.encode_ids(text, add_special_tokens)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """The text of ids."""
        return self._tok.decode(list(ids), skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for, leading space included (what an API shows
        per token with its logprob). A token may hold part of a UTF-8 character."""
        piece = self._tok.id_to_token(token_id)
        if piece is None:
            return b""
        if token_id in self._special_ids:
            return piece.encode()
        if self._byte_level is not None:
            return bytes(self._byte_level[c] for c in piece if c in self._byte_level)
        match = _BYTE_FALLBACK.fullmatch(piece)  # SentencePiece byte fallback
        return bytes([int(match.group(1), 16)]) if match else piece.replace("\u2581", " ").encode()

    def token_text(self, token_id: int) -> str:
        """One token's text as logprobs show it (a part of a UTF-8 character as U+FFFD)."""
        return self.token_bytes(token_id).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None) -> str:
        """`messages` ([{"role", "content"}], content text or a list of parts) rendered
        by the model's own chat template, as transformers renders it. The text holds
        the special tokens the template writes (BOS among them): encode it with
        add_special_tokens=False (chat_ids does)."""
        if not isinstance(messages, (list, tuple)) or not all(isinstance(m, dict) for m in messages):
            raise TypeError(f"messages must be a list of {{'role': ..., 'content': ...}} dicts, "
                            f"got {type(messages).__name__}" + (
                                f" {messages[:40]!r}" if isinstance(messages, str) else ""))
        if not self.chat_template:
            raise ValueError("this model has no chat template (neither tokenizer_config.json "
                             "nor the GGUF file holds one): give one with chat_template= "
                             "(--chat-template FILE or TEMPLATE), or use a plain prompt")
        if not messages:
            raise ValueError("chat needs at least one message")
        for i, m in enumerate(messages):
            _check_message(i, m)
        names = {"bos_token": self.bos_token or "", "eos_token": self.eos_token or ""}
        if tools is not None:
            names["tools"] = tools
        return render(self.chat_template, [dict(m) for m in messages], add_generation_prompt,
                      **names)

    def chat_ids(self, messages: list[dict], add_generation_prompt: bool = True,
                 tools: list[dict] | None = None, max_model_len: int | None = None) -> list[int]:
        """The rendered conversation's token ids (no BOS added: the template writes it);
        max_model_len as encode's."""
        text = self.apply_chat_template(messages, add_generation_prompt, tools)
        self.check_fits(text, max_model_len)
        return self._ids(text, add_special_tokens=False)

    def detokenizer(self, context: list[int] = (),
                    skip_special_tokens: bool = True) -> "IncrementalDetokenizer":
        """context: the tokens the text follows (a prompt), whose text is not emitted.
        Their last few make the first new token decode as it reads after them: a
        SentencePiece word keeps its leading space ("a" + "▁little" is "a little",
        where "▁little" alone decodes as "little")."""
        return IncrementalDetokenizer(self, context, skip_special_tokens)

    def continuation(self, context: list[int], ids: list[int]) -> str:
        """The text of ids as it reads after context (see detokenizer)."""
        tail = list(context[-CONTEXT_TOKENS:])
        return self.decode(tail + list(ids))[len(self.decode(tail)):]


CONTEXT_TOKENS = 5  # of a prompt, before the first generated token (vLLM's choice too)


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas, never splitting a UTF-8
    character: a byte-level token can hold part of one, which decodes as U+FFFD
    until the rest arrives. Decodes only a short window of recent tokens, so the
    cost per token does not grow with the text."""

    def __init__(self, tokenizer: Tokenizer, context: list[int] = (),
                 skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = list(context[-CONTEXT_TOKENS:])
        self.prefix_offset = 0  # window start: context so that spaces decode right
        self.read_offset = len(self.ids)  # tokens before this are already emitted

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, self.skip_special_tokens)

    def push(self, token_id: int) -> str:
        """Add one token; return the newly completed text (maybe "")."""
        self.ids.append(token_id)
        decode = self._decode
        prefix = decode(self.ids[self.prefix_offset:self.read_offset])
        full = decode(self.ids[self.prefix_offset:])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return full[len(prefix):]
        return ""

    def flush(self) -> str:
        """Whatever is still held back at the end of generation, less a character cut
        short at the very end (its bytes decode as U+FFFD; token ids keep them)."""
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        full = self._decode(self.ids[self.prefix_offset:])
        self.prefix_offset = self.read_offset = len(self.ids)
        return full[len(prefix):].rstrip("\ufffd")
