"""The compiled parts of SentencePieceBPE (sentencepiece_bpe.py): a hash table from a
piece's UTF-8 bytes to its id, a trie of the pieces matched in the raw text first
(control and user-defined tokens), and the merge loop.

A vocabulary is held as one byte string of all pieces (blob) and their bounds
(offsets, (n + 1,)): 262,144 pieces take ~4.5 MB here, against ~115 MB held by a
`tokenizers` BPE with the 513,511 merges that express the same rule.

Indices passed between the kernels are int64, never a literal 0 or an int32 array's
element, and the bytes looked up are writable: numba compiles a callee once for each
distinct set of argument types it is called with (each set ~0.2-1 s of a first run).
"""
from __future__ import annotations

import numpy as np
from numba import int64, uint64

from ..jit_cache import cached_njit
from .gguf_vocab import SPACE

NO_ID = -1
SPACE_BYTES = np.frombuffer(SPACE.encode(), dtype=np.uint8)  # (its 3 bytes)


@cached_njit(nogil=True)
def _hash(data, start, end):
    """FNV-1a over data[start:end]."""
    h = uint64(14695981039346656037)
    for i in range(start, end):
        h = (h ^ uint64(data[i])) * uint64(1099511628211)
    return h


@cached_njit(nogil=True)
def _same(data, start, end, blob, offsets, piece):
    s, e = offsets[piece], offsets[piece + 1]
    if e - s != end - start:
        return False
    for i in range(end - start):
        if blob[s + i] != data[start + i]:
            return False
    return True


@cached_njit(nogil=True)
def lookup(table, blob, offsets, data, start, end):
    """The id of the piece whose bytes are data[start:end], or NO_ID."""
    mask = uint64(len(table) - 1)
    slot = int64(_hash(data, start, end) & mask)
    while table[slot] != NO_ID:
        if _same(data, start, end, blob, offsets, table[slot]):
            return table[slot]
        slot = int64((uint64(slot) + uint64(1)) & mask)
    return NO_ID


@cached_njit(nogil=True)
def fill_table(table, blob, offsets):
    """Every piece into table (NO_ID-filled, a power of two over twice the pieces);
    returns the id of a piece whose bytes an earlier piece has too, else NO_ID."""
    mask = uint64(len(table) - 1)
    for piece in range(len(offsets) - 1):
        s, e = offsets[piece], offsets[piece + 1]
        slot = int64(_hash(blob, s, e) & mask)
        while table[slot] != NO_ID:
            if _same(blob, s, e, blob, offsets, table[slot]):
                return piece
            slot = int64((uint64(slot) + uint64(1)) & mask)
        table[slot] = piece
    return NO_ID


@cached_njit(nogil=True)
def build_trie(blob, offsets, pieces, root, byte, child, sibling, token):
    """A trie of the given pieces' bytes. root (256,): the first byte's node; node n
    has its byte, its first child and next sibling, and the piece ending there
    (NO_ID if none). Arrays sized for every byte of the pieces; returns nodes used."""
    used = 0
    for piece in pieces:
        s, e = offsets[piece], offsets[piece + 1]
        node = NO_ID
        for i in range(s, e):
            b = blob[i]
            if node == NO_ID:
                found = root[b]
            else:
                found = child[node]
                while found != NO_ID and byte[found] != b:
                    found = sibling[found]
            if found == NO_ID:
                found = used
                used += 1
                byte[found], child[found], token[found] = b, NO_ID, NO_ID
                if node == NO_ID:
                    sibling[found], root[b] = NO_ID, found
                else:
                    sibling[found], child[node] = child[node], found
            node = found
        if node != NO_ID:
            token[node] = piece
    return used


@cached_njit(nogil=True)
def _longest_match(data, i, root, byte, child, sibling, token):
    """(piece, end) of the longest trie piece starting at data[i], or (NO_ID, i)."""
    best, best_end = NO_ID, i
    node = root[data[i]]
    j = i
    while node != NO_ID:
        j += 1
        if token[node] != NO_ID:
            best, best_end = token[node], j
        if j == len(data):
            break
        node = child[node]
        while node != NO_ID and byte[node] != data[j]:
            node = sibling[node]
    return best, best_end


@cached_njit(nogil=True)
def _char_bytes(lead):
    if lead < 0x80:
        return 1
    if lead < 0xE0:
        return 2
    if lead < 0xF0:
        return 3
    return 4


# a merge candidate's fields (a row of `found`, with its score beside it)
WHOLE, LEFT, AT, RIGHT = 0, 1, 2, 3


@cached_njit(nogil=True)
def _before(score, found, a, b):
    """Candidate a merges before b: the better whole piece's score, then the lower
    whole id, the lower left id, the leftmost place (a `tokenizers` BPE's rank order
    for the merges that sentencepiece_merges lists)."""
    if score[a] != score[b]:
        return score[a] < score[b]
    for field in (WHOLE, LEFT, AT):
        if found[a, field] != found[b, field]:
            return found[a, field] < found[b, field]
    return False


@cached_njit(nogil=True)
def _push(heap, size, score, found, item):
    heap[size] = item
    k = size
    while k > 0:
        parent = (k - 1) // 2
        if not _before(score, found, heap[k], heap[parent]):
            break
        heap[k], heap[parent] = heap[parent], heap[k]
        k = parent
    return size + 1


@cached_njit(nogil=True)
def _pop(heap, size, score, found):
    top = heap[0]
    size -= 1
    heap[0] = heap[size]
    k = 0
    while True:
        first, a, b = k, 2 * k + 1, 2 * k + 2
        if a < size and _before(score, found, heap[a], heap[first]):
            first = a
        if b < size and _before(score, found, heap[b], heap[first]):
            first = b
        if first == k:
            return top, size
        heap[k], heap[first] = heap[first], heap[k]
        k = first


@cached_njit(nogil=True)
def _offer(x, y, text, start, end, sym, fixed, vocab, score, found, heap, items, size):
    """Symbols x and y (neighbours) as a candidate, where their joined bytes are a
    normal piece; returns (items, size) after."""
    table, blob, offsets, mergeable, neg_score = vocab
    if fixed[x] or fixed[y]:
        return items, size
    piece = lookup(table, blob, offsets, text, start[x], end[y])
    if piece == NO_ID or not mergeable[piece]:
        return items, size
    score[items] = neg_score[piece]
    found[items, WHOLE], found[items, LEFT], found[items, AT], found[items, RIGHT] = piece, sym[x], x, y
    return items + 1, _push(heap, size, score, found, items)


@cached_njit(nogil=True)
def _put(dst, at, src):
    """dst[at:at + len(src)] = src, element by element (numba compiles an array assigned to
    a slice with its shape-mismatch message: ~3 s of a cold process); returns the end."""
    for j in range(len(src)):
        dst[at + j] = src[j]
    return at + len(src)


@cached_njit(nogil=True)
def _grown(out, n_out, size):
    """A new array of `size` holding out's first n_out values."""
    grown = np.empty(size, out.dtype)
    _put(grown, np.int64(0), out[:n_out])
    return grown


@cached_njit(nogil=True)
def _merge_segment(text, out, n_out, vocab, byte_ids):
    """text: one normalized segment's bytes; writes its ids to out from n_out (room
    for len(text) of them) and returns the new count. Symbols start as characters (a
    character outside the vocabulary as its byte pieces, which never merge); then the
    best adjacent pair whose joined bytes are a normal piece merges, until none is
    left. A candidate is stale once either side has changed: its two symbols no
    longer neighbours, or no longer spanning exactly its whole piece's bytes."""
    table, blob, offsets = vocab[0], vocab[1], vocab[2]
    n = len(text)
    start = np.empty(n, np.int64)
    end = np.empty(n, np.int64)
    sym = np.empty(n, np.int32)
    fixed = np.zeros(n, np.bool_)
    m, i = 0, np.int64(0)
    while i < n:
        step = min(_char_bytes(text[i]), n - i)
        piece = lookup(table, blob, offsets, text, i, i + step)
        if piece != NO_ID:
            start[m], end[m], sym[m] = i, i + step, piece
            m += 1
        else:
            for j in range(i, i + step):
                start[m], end[m], sym[m], fixed[m] = j, j + 1, byte_ids[text[j]], True
                m += 1
        i += step
    nxt = np.arange(1, m + 1)
    prev = np.arange(-1, m - 1)
    alive = np.ones(m, np.bool_)
    cap = 3 * m + 1  # (the first m - 1 candidates, then at most two a merge)
    score = np.empty(cap, np.float32)
    found = np.empty((cap, 4), np.int64)
    heap = np.empty(cap, np.int32)
    items, size = np.int64(0), np.int64(0)
    for a in range(m - 1):
        items, size = _offer(a, a + 1, text, start, end, sym, fixed, vocab, score, found,
                             heap, items, size)
    while size > 0:
        item, size = _pop(heap, size, score, found)
        a, b, w = found[item, AT], found[item, RIGHT], found[item, WHOLE]
        if not alive[a] or not alive[b] or nxt[a] != b \
                or end[b] - start[a] != offsets[w + 1] - offsets[w]:
            continue
        end[a], sym[a] = end[b], w
        alive[b] = False
        nxt[a] = nxt[b]
        if nxt[a] < m:
            prev[nxt[a]] = a
            items, size = _offer(a, nxt[a], text, start, end, sym, fixed, vocab, score, found,
                                 heap, items, size)
        if prev[a] >= 0:
            items, size = _offer(prev[a], a, text, start, end, sym, fixed, vocab, score, found,
                                 heap, items, size)
    k = 0
    while k < m:
        out[n_out] = sym[k]
        n_out += 1
        k = nxt[k]
    return n_out


@cached_njit(nogil=True)
def encode(data, prefix_space, vocab, byte_ids, root, byte, child, sibling, token):
    """Token ids (int32) of UTF-8 data. vocab: (table, blob, offsets, mergeable,
    neg_score): the hash table, the pieces, which are normal pieces (only they are
    merged into), and minus each piece's score. The trie's pieces matched in the raw text
    first (leftmost, longest), each stretch between them normalized (spaces as "▁",
    one put first when prefix_space) and merged on its own."""
    n = len(data)
    out = np.empty(n + 16, np.int32)
    n_out, i, seg = np.int64(0), np.int64(0), 0
    while i <= n:
        piece, stop = NO_ID, i
        if i < n:
            piece, stop = _longest_match(data, i, root, byte, child, sibling, token)
            if piece == NO_ID:
                i += 1
                continue
        if i > seg:  # the stretch before this match (or before the text's end)
            text = np.empty(3 * (i - seg) + 3, np.uint8)
            t = np.int64(0)
            if prefix_space:
                t = _put(text, t, SPACE_BYTES)
            for j in range(seg, i):
                if data[j] == 32:
                    t = _put(text, t, SPACE_BYTES)
                else:
                    text[t] = data[j]
                    t += 1
            if n_out + t + 1 > len(out):  # (a stretch gives at most a token a byte)
                out = _grown(out, n_out, 2 * (n_out + t + 1))
            n_out = _merge_segment(text[:t], out, n_out, vocab, byte_ids)
        if i == n:
            break
        if n_out + 1 > len(out):
            out = _grown(out, n_out, 2 * (n_out + 1))
        out[n_out] = piece
        n_out += 1
        i = seg = stop
    return out[:n_out]
