"""HFTokens: a `tokenizers` Tokenizer (a HF folder's tokenizer.json, or one rebuilt
from a GGUF's vocabulary) answering what tokenizer.py asks of a vocabulary, as
SentencePieceBPE answers it too."""
from __future__ import annotations

import json

LONG_TEXT = 1 << 16  # characters past which encoding lets other threads run


class HFTokens:
    def __init__(self, tokenizer):
        """tokenizer: a `tokenizers.Tokenizer` (imported by whoever made it: a
        SentencePiece GGUF's engine never loads that package)."""
        self._tok = tokenizer
        # the decoder alone as JSON (the whole tokenizer's, for a 262,144-token
        # vocabulary, took ~150 MiB as Python objects)
        decoder = json.loads(tokenizer.decoder.__getstate__()) if tokenizer.decoder else {}
        parts = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
        self.byte_level = any(d.get("type") == "ByteLevel" for d in parts)
        self.special_ids = frozenset(tokenizer.get_added_tokens_decoder())

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def token_to_id(self, piece: str) -> int | None:
        return self._tok.token_to_id(piece)

    def encode_ids(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """A long text goes through encode_batch, which lets go of the GIL while it
        works (encode keeps it: 2.7 s for 4 MB, during which no other thread ran)."""
        if len(text) > LONG_TEXT:
            return self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """(A long list through decode_batch, which lets go of the GIL.)"""
        if len(ids) > LONG_TEXT // 4:
            return self._tok.decode_batch([ids], skip_special_tokens=skip_special_tokens)[0]
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def vocab_dict(self) -> dict[str, int]:
        return self._tok.get_vocab(with_added_tokens=True)

    def json_text(self) -> str:
        return self._tok.to_str()

    def text_bytes_bound(self) -> int:
        """Bytes of text one token stands for, or more: a byte-level token's characters
        are its bytes; any other token's UTF-8 bytes bound its text's; twice that where
        a normalizer may compose characters."""
        added = {self._tok.id_to_token(i) for i in self.special_ids}
        longest = max(len(t) if self.byte_level and t not in added else len(t.encode("utf-8"))
                      for t in self.vocab_dict())
        return longest * (2 if self._tok.normalizer else 1)
