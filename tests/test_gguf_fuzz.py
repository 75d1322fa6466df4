"""GGUF files whose headers lie (counts, dimensions, offsets, types, lengths): every
one is a clear ValueError naming the file, or loads; never another exception, a
hang or a huge allocation (hypothesis, bounded in time)."""
import struct

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import gguf_writer as gw
from test_gguf_convert import write_tiny_llama_gguf
from tinypaged.formats.gguf import GGUFFile
from tinypaged.model.gguf_model import load_gguf_model
from tinypaged.tokenizer import Tokenizer


class ValidFile:
    """A valid tiny GGUF's bytes (with a short repr, for hypothesis's reports)."""

    def __init__(self, data: bytes, header_end: int):
        self.data, self.header_end = data, header_end
        self.infos_start = data.find(b"token_embd.weight") - 8  # the tensor infos follow

    def __repr__(self):
        return f"<tiny GGUF, {len(self.data)} bytes, header {self.header_end}>"


@pytest.fixture(scope="module")
def valid_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "tiny.gguf"
    write_tiny_llama_gguf(path, ffn_up_type=gw.GGML_Q8_0)
    header_end = GGUFFile(path).tensors["token_embd.weight"].offset  # where tensor data starts
    return ValidFile(path.read_bytes(), header_end)


LIES = st.sampled_from([0, 1, 2, 3, 7, 8, 9, 12, 255, 2 ** 16, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1,
                        2 ** 32, 2 ** 62, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1])


@st.composite
def corruptions(draw, valid: ValidFile):
    """A few edits of the header: a u32 or u64 overwritten with a lie, or random bytes,
    at the counts, among the tensor infos (names, dims, types, offsets), or anywhere."""
    size, edits = len(valid.data), []
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.one_of(st.integers(4, 23), st.integers(valid.infos_start, valid.header_end - 8),
                            st.integers(4, valid.header_end - 8)))
        kind = draw(st.sampled_from(["u64", "u32", "bytes"]))
        if kind == "bytes":
            edits.append((at, draw(st.binary(min_size=1, max_size=8))))
        else:
            value = draw(LIES) % (2 ** 32 if kind == "u32" else 2 ** 64)
            edits.append((at, struct.pack("<I" if kind == "u32" else "<Q", value)))
    cut = draw(st.one_of(*[st.just(size)] * 9, st.integers(0, size)))  # sometimes truncated
    return edits, cut


@settings(max_examples=300, deadline=5000, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(data=st.data())
def test_a_lying_header_is_a_clear_error_or_loads(valid_gguf, tmp_path, data):
    original = valid_gguf.data
    edits, cut = data.draw(corruptions(valid_gguf))
    broken = bytearray(original)
    for at, new in edits:
        broken[at:at + len(new)] = new
    path = tmp_path / "broken.gguf"
    path.write_bytes(bytes(broken[:cut]))
    for load in (load_gguf_model, Tokenizer):
        try:
            load(path)
            event(f"{load.__name__}: loads")
        except ValueError as e:
            message = str(e)
            event(f"{load.__name__}: " + " ".join(message.replace(str(path), "").split()[1:4]))
            assert str(path) in message and "\n" not in message, message


@pytest.mark.parametrize("dims", [(2 ** 63, 32), (2 ** 64 - 1, 1), (2 ** 32, 2 ** 32), (3, 2 ** 40)])
def test_dimensions_that_overflow_are_a_truncation_error(tmp_path, dims):
    """Their product, in int64, would wrap to 0 or below and pass the size check."""
    writer = gw.GGUFWriter()
    writer.add_raw_tensor("t", dims, gw.GGML_Q8_0 if dims[-1] % 32 == 0 else gw.GGML_F32, b"\0" * 64)
    writer.write(tmp_path / "t.gguf")
    with pytest.raises(ValueError, match=r"t\.gguf: truncated GGUF file: tensor 't' needs bytes"):
        GGUFFile(tmp_path / "t.gguf")
