import struct

import numpy as np
import pytest

import gguf_writer as gw
from tinypaged.formats.gguf import GGUFFile


def test_metadata_of_every_type_round_trips(tmp_path):
    w = gw.GGUFWriter()
    values = [("a.u8", gw.U8, 200), ("a.i8", gw.I8, -5), ("a.u16", gw.U16, 60000),
              ("a.i16", gw.I16, -30000), ("a.u32", gw.U32, 4_000_000_000), ("a.i32", gw.I32, -7),
              ("a.f32", gw.F32_T, 0.5), ("a.bool", gw.BOOL, True), ("a.str", gw.STRING, "héllo ✓"),
              ("a.u64", gw.U64, 2 ** 40), ("a.i64", gw.I64, -(2 ** 40)), ("a.f64", gw.F64_T, 1e-300)]
    for key, vtype, value in values:
        w.add(key, vtype, value)
    w.add("a.strs", gw.ARRAY, (gw.STRING, ["x", "Ġthe", ""]))
    w.add("a.ints", gw.ARRAY, (gw.I32, [1, -2, 3]))
    w.add("a.floats", gw.ARRAY, (gw.F32_T, [0.25, -1.5]))
    w.write(tmp_path / "m.gguf")
    g = GGUFFile(tmp_path / "m.gguf")
    for key, _, value in values:
        assert g.metadata[key] == value, key
    assert g.metadata["a.strs"] == ["x", "Ġthe", ""]
    np.testing.assert_array_equal(g.metadata["a.ints"], [1, -2, 3])
    np.testing.assert_array_equal(g.metadata["a.floats"], [0.25, -1.5])
    assert g.tensors == {}


@pytest.mark.parametrize("ggml_type, max_error_in_steps", [
    (gw.GGML_F32, 0), (gw.GGML_F16, None), (gw.GGML_BF16, None),
    (gw.GGML_Q8_0, 0.57), (gw.GGML_Q4_1, 0.51),
    (gw.GGML_Q4_0, 1.0)])  # Q4_0 clips the side opposite the largest magnitude to 7 steps
@pytest.mark.parametrize("alignment", [32, 64])
def test_tensors_round_trip_within_their_quantisation_error(tmp_path, ggml_type,
                                                            max_error_in_steps, alignment):
    rng = np.random.default_rng(ggml_type * 100 + alignment)
    w = gw.GGUFWriter(alignment=alignment)
    x = rng.standard_normal((3, 5, 64)).astype(np.float32)  # 3-D and non-square: dims order
    y = rng.standard_normal((7, 96)).astype(np.float32) * 3 + 1
    ex = w.add_tensor("x", x, ggml_type)
    ey = w.add_tensor("y", y, ggml_type)
    w.write(tmp_path / "t.gguf")
    g = GGUFFile(tmp_path / "t.gguf")
    assert g.tensors["x"].shape == (3, 5, 64) and g.tensors["y"].shape == (7, 96)
    assert all(info.offset % alignment == 0 for info in g.tensors.values())
    for name, orig, expected in [("x", x, ex), ("y", y, ey)]:
        got = g.load(name)
        assert got.dtype == np.float32 and got.shape == orig.shape
        # the reader decodes exactly what the writer encoded ...
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
        # ... and that is the original up to the type's quantisation step
        if ggml_type in (gw.GGML_F16, gw.GGML_BF16):
            bits = 11 if ggml_type == gw.GGML_F16 else 7  # the writer truncates to bf16
            np.testing.assert_allclose(got, orig, rtol=2.0 ** -bits)
        elif max_error_in_steps is not None:
            blocks = orig.reshape(-1, 32)
            span = np.abs(blocks).max(axis=1) if ggml_type != gw.GGML_Q4_1 else np.ptp(blocks, axis=1)
            levels = {gw.GGML_F32: 1, gw.GGML_Q8_0: 127, gw.GGML_Q4_0: 8, gw.GGML_Q4_1: 15}
            step = span / levels[ggml_type]  # the block's quantisation step
            err = np.abs(got.reshape(-1, 32) - blocks).max(axis=1)
            assert np.all(err <= max_error_in_steps * step + 1e-3 * np.abs(blocks).max(axis=1))


def test_zero_blocks_quantise_to_zero(tmp_path):
    w = gw.GGUFWriter()
    for name, t in [("q8", gw.GGML_Q8_0), ("q40", gw.GGML_Q4_0), ("q41", gw.GGML_Q4_1)]:
        w.add_tensor(name, np.zeros((2, 32), np.float32), t)
    w.write(tmp_path / "z.gguf")
    g = GGUFFile(tmp_path / "z.gguf")
    for name in ("q8", "q40", "q41"):
        np.testing.assert_array_equal(g.load(name), 0)


def test_unsupported_quantisation_type_is_named(tmp_path):
    w = gw.GGUFWriter()
    w.add_raw_tensor("k", (256,), gw.GGML_Q2_K, b"\0" * 84)
    w.write(tmp_path / "k.gguf")
    g = GGUFFile(tmp_path / "k.gguf")
    with pytest.raises(ValueError, match="'k' uses quantisation type Q2_K.*supported: F32"):
        g.load("k")


def test_truncated_bad_magic_and_missing_files(tmp_path):
    w = gw.GGUFWriter()
    w.add("general.architecture", gw.STRING, "llama")
    w.add_tensor("x", np.ones((4, 32), np.float32), gw.GGML_Q8_0)
    data = w.to_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:-30])  # 24 bytes of padding end the file
    with pytest.raises(ValueError, match="truncated GGUF file: tensor 'x'"):
        GGUFFile(tmp_path / "cut.gguf")
    (tmp_path / "short.gguf").write_bytes(data[:30])
    with pytest.raises(ValueError, match="truncated GGUF file"):
        GGUFFile(tmp_path / "short.gguf")
    (tmp_path / "magic.gguf").write_bytes(b"GGML" + data[4:])
    with pytest.raises(ValueError, match="not a GGUF file"):
        GGUFFile(tmp_path / "magic.gguf")
    with pytest.raises(FileNotFoundError):
        GGUFFile(tmp_path / "absent.gguf")
    (tmp_path / "ok.gguf").write_bytes(data)
    with pytest.raises(ValueError, match="'y' is missing"):
        GGUFFile(tmp_path / "ok.gguf").load("y")


def test_header_counts_are_checked_against_the_file_before_reading(tmp_path):
    """An array, key or tensor count that the file's size cannot hold is refused before
    anything is read for it (a count of 2**40 strings would otherwise loop and fill
    memory until the end of the file); a key or tensor named twice is refused too."""
    w = gw.GGUFWriter()
    w.add("general.architecture", gw.STRING, "llama")
    w.add("tokenizer.ggml.tokens", gw.ARRAY, (gw.STRING, ["a", "b", "c"]))
    w.add_tensor("x", np.ones((4, 32), np.float32))
    data = bytearray(w.to_bytes())
    at = data.find(b"tokenizer.ggml.tokens") + len("tokenizer.ggml.tokens") + 8  # its count
    assert struct.unpack_from("<Q", data, at)[0] == 3
    struct.pack_into("<Q", data, at, 2 ** 40)
    (tmp_path / "array.gguf").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"array\.gguf: corrupt GGUF metadata: an array of "
                                         r"1099511627776 items"):
        GGUFFile(tmp_path / "array.gguf")
    data = bytearray(w.to_bytes())
    struct.pack_into("<Q", data, 8, 10 ** 9)  # tensors
    (tmp_path / "count.gguf").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"count\.gguf: truncated GGUF file, or a corrupt "
                                         r"header: 1000000000 tensors"):
        GGUFFile(tmp_path / "count.gguf")
    twice = gw.GGUFWriter()
    twice.add("general.architecture", gw.STRING, "llama")
    twice.add("general.architecture", gw.STRING, "qwen3")
    twice.write(tmp_path / "key.gguf")
    with pytest.raises(ValueError, match=r"key\.gguf: .*'general\.architecture' appears twice"):
        GGUFFile(tmp_path / "key.gguf")
    twice = gw.GGUFWriter()
    twice.add_tensor("x", np.ones((4, 32), np.float32))
    twice.add_tensor("x", np.zeros((4, 32), np.float32))
    twice.write(tmp_path / "tensor.gguf")
    with pytest.raises(ValueError, match=r"tensor\.gguf: .*tensor 'x' appears twice"):
        GGUFFile(tmp_path / "tensor.gguf")
