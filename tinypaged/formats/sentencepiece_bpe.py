"""SentencePieceBPE: a GGUF's SentencePiece vocabulary (tokenizer.ggml.model = llama:
Llama 1-2, Mistral, Gemma) tokenized from its pieces and scores as they are, the same
ids as the `tokenizers` BPE that gguf_tokenizer.build_sentencepiece expresses the rule
as, at a thirteenth of its memory: Gemma 3's 262,144 pieces held ~115 MB there (a
hash map both ways and 513,511 merges) and ~9 MB here, which is most of what its
`generate` held beyond the weights.

The rule (llama.cpp's, and the file's own): the control and user-defined pieces are
matched in the raw text first, leftmost and longest; each stretch between them has
its spaces written as "▁" (one put first when add_space_prefix); its characters,
bytes for those outside the vocabulary, then merge pairwise, the pair whose joined
piece scores best first (sentencepiece_kernels.py). Decoding writes "▁" as a space,
gathers byte pieces into characters (U+FFFD for each byte of one that is not), and
drops the leading space the prefix put there.
"""
from __future__ import annotations

import re

import numpy as np

from . import sentencepiece_kernels as kernels
from .gguf import GGUFFile
from .gguf_vocab import (SPACE, TOKEN_BYTE, TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_USER_DEFINED, bos_of,
                         sentencepiece_arrays)

_BYTE_PIECE = re.compile(rb"<0x([0-9A-Fa-f]{2})>")
_SPACE = SPACE.encode()


class SentencePieceMisfit(Exception):
    """A vocabulary this class would tokenize otherwise than the `tokenizers` form does
    (tokenizer.py then builds that one): a piece twice, a byte piece missing, a byte
    piece's text inside a normal piece."""


class SentencePieceBPE:
    """The vocabulary's pieces as one byte string with their bounds, a hash table over
    them, the scores and kinds, and a trie of the pieces matched first."""

    def __init__(self, pieces: list[str], types: list[int], scores: np.ndarray,
                 add_space_prefix: bool, bos_id: int | None, source: str):
        encoded = [p.encode("utf-8") for p in pieces]
        self.offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in encoded], out=self.offsets[1:])
        self.blob = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        del encoded
        kinds = np.asarray(types, dtype=np.int8)
        self.table = np.full(1 << max(4, (2 * len(pieces) - 1).bit_length()), kernels.NO_ID,
                             dtype=np.int32)
        again = kernels.fill_table(self.table, self.blob, self.offsets)
        if again != kernels.NO_ID:
            raise SentencePieceMisfit(f"{source}: piece {again} ({pieces[again]!r}) appears "
                                      f"twice in the vocabulary")
        byte_ids = [self.token_to_id(f"<0x{b:02X}>") for b in range(256)]
        missing = [b for b, found in enumerate(byte_ids) if found is None]
        if missing:
            raise SentencePieceMisfit(f"{source}: byte piece <0x{missing[0]:02X}> is missing")
        self.byte_ids = np.array(byte_ids, dtype=np.int32)
        mergeable = kinds == TOKEN_NORMAL
        self.vocab = (self.table, self.blob, self.offsets, mergeable,
                      -np.asarray(scores, dtype=np.float32))
        added = np.flatnonzero(np.isin(kinds, (TOKEN_CONTROL, TOKEN_USER_DEFINED)))
        self.special_ids = frozenset(added.tolist())  # (matched in the raw text first)
        self.skipped = kinds == TOKEN_CONTROL  # (decode's skip_special_tokens)
        self.trie = self._trie(added)
        self.add_space_prefix, self.bos_id, self.source = add_space_prefix, bos_id, source
        self.byte_level = False

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> "SentencePieceBPE":
        pieces, types, scores = sentencepiece_arrays(gguf)
        if not _byte_pieces_stand_alone(pieces, types):
            raise SentencePieceMisfit(f"{gguf.path}: a normal piece holds a byte piece's text")
        bos = bos_of(gguf, pieces)
        return cls(pieces, types, scores, gguf.get("tokenizer.ggml.add_space_prefix", True) is True,
                   None if bos is None else bos[1], gguf.path)

    def _trie(self, added: np.ndarray) -> tuple:
        matched = added.astype(np.int64)
        size = int((self.offsets[matched + 1] - self.offsets[matched]).sum()) + 1
        root = np.full(256, kernels.NO_ID, dtype=np.int32)
        byte, child, sibling, token = (np.empty(size, dtype=np.int32) for _ in range(4))
        used = kernels.build_trie(self.blob, self.offsets, matched, root, byte, child, sibling, token)
        return root, byte[:used].copy(), child[:used].copy(), sibling[:used].copy(), token[:used].copy()

    # -- the tokenizer's questions ------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self.offsets) - 1

    def piece_bytes(self, token_id: int) -> bytes:
        return self.blob[self.offsets[token_id]:self.offsets[token_id + 1]].tobytes()

    def id_to_token(self, token_id: int) -> str | None:
        if not 0 <= token_id < self.vocab_size:
            return None
        return self.piece_bytes(token_id).decode("utf-8")

    def token_to_id(self, piece: str) -> int | None:
        # (writable, as encode's segments are: lookup compiled once)
        data = np.frombuffer(bytearray(piece.encode("utf-8")), dtype=np.uint8)
        found = kernels.lookup(self.table, self.blob, self.offsets, data, 0, len(data))
        return None if found == kernels.NO_ID else int(found)

    def text_bytes_bound(self) -> int:
        """Bytes of text one token stands for, or more: its piece's bytes (a "▁" is 3
        for a space's 1), doubled as for any vocabulary with a normalizer."""
        return 2 * int(np.diff(self.offsets).max())

    def encode_ids(self, text: str, add_special_tokens: bool = True) -> list[int]:
        data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        ids = kernels.encode(data, self.add_space_prefix, self.vocab, self.byte_ids, *self.trie).tolist()
        return [self.bos_id, *ids] if add_special_tokens and self.bos_id is not None else ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """As the `tokenizers` decoder chain Replace("▁", " "), ByteFallback, Fuse and
        (with the prefix) Strip(" ", 1, 0) gives it; ids outside the vocabulary are left out."""
        parts, pending = [], bytearray()
        for token_id in ids:
            if not 0 <= token_id < self.vocab_size or (skip_special_tokens and self.skipped[token_id]):
                continue
            piece = self.piece_bytes(token_id)
            byte = _BYTE_PIECE.fullmatch(piece)
            if byte is not None:
                pending.append(int(byte.group(1), 16))
                continue
            if pending:
                parts.append(_bytes_text(pending))
                pending.clear()
            parts.append(piece.replace(_SPACE, b" ").decode("utf-8"))
        if pending:
            parts.append(_bytes_text(pending))
        text = "".join(parts)
        return text[1:] if self.add_space_prefix and text.startswith(" ") else text

    def vocab_dict(self) -> dict[str, int]:
        return {self.id_to_token(i): i for i in range(self.vocab_size)}

    def json_text(self) -> str:
        """The `tokenizers` form as tokenizer.json text (for llguidance), built on demand."""
        from .gguf_tokenizer import build_sentencepiece  # (imports `tokenizers`)
        return build_sentencepiece(GGUFFile.open(self.source)).to_str()


def _bytes_text(pending: bytearray) -> str:
    """Byte pieces in a row: their character(s), or U+FFFD for each byte if they are
    not whole UTF-8."""
    try:
        return pending.decode("utf-8")
    except UnicodeDecodeError:
        return "\ufffd" * len(pending)


def _byte_pieces_stand_alone(pieces: list[str], types: list[int]) -> bool:
    """No normal piece is a byte piece's text joined to another piece (byte pieces
    stand for characters outside the vocabulary here and never merge; as text in the
    `tokenizers` form's merges they could)."""
    names = {p for p, t in zip(pieces, types) if t == TOKEN_BYTE}
    return not any(t == TOKEN_NORMAL and len(p) > 6 and (p[:6] in names or p[-6:] in names)
                   for p, t in zip(pieces, types))
