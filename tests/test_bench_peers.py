"""The benchmark's measuring tools: the llama.cpp peer's output parsing (against
stand-in executables that print what llama-bench and llama-batched-bench print) and
the peak-RSS probe of a real `cli.py generate` run; the cross-core probe."""
import json
import stat

import numpy as np
import pytest
from numba import get_num_threads, get_thread_id, njit, prange

from helpers import write_tiny_model

from tinypaged.bench import cross_core, llama_cpp_peer, peak_rss


def fake_binary(path, stdout: str, code: int = 0, stderr: str = ""):
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{stdout}\nEOF\necho '{stderr}' >&2\nexit {code}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_the_llama_cpp_rows_come_from_its_own_output_formats(tmp_path):
    bench_rows = [{"n_prompt": 0, "n_gen": 64, "avg_ts": 151.5, "stddev_ts": 2.5,
                   "build_commit": "abc", "cpu_info": "AMD EPYC"}]
    bench = fake_binary(tmp_path / "llama-bench", json.dumps(bench_rows))
    batched_lines = ["main: n_kv_max = 1600", json.dumps({"pp": 16, "tg": 32, "pl": 32,
                                                          "speed_pp": 900.0, "speed_tg": 276.25})]
    fake_binary(tmp_path / "llama-batched-bench", "\n".join(batched_lines))
    out = llama_cpp_peer.run(str(bench), tmp_path / "m.gguf", log=lambda _: None)
    assert out["batch1"]["tokens_per_s"] == 151.5 and out["batch1"]["cpu"] == "AMD EPYC"
    assert out["concurrent32"]["tokens_per_s"] == 276.25


def test_a_failing_peer_is_one_error_naming_it(tmp_path):
    bench = fake_binary(tmp_path / "llama-bench", "", code=1, stderr="error: failed to load model")
    with pytest.raises(RuntimeError, match=r"llama-bench failed \(1\): error: failed to load model"):
        llama_cpp_peer.run(str(bench), tmp_path / "m.gguf", log=lambda _: None)


def test_peak_rss_counts_the_weights_a_run_holds(tmp_path):
    """Two models alike but for the MLP's width: the probe's difference is the bigger
    one's extra weights (held once as float16, ~48 MiB), give or take the load's
    transient copies, not the noise of a process's other memory."""
    small, big = tmp_path / "small", tmp_path / "big"
    shape = dict(hidden_size=512, num_attention_heads=8, num_key_value_heads=4, num_hidden_layers=2)
    write_tiny_model(str(small), dtype="F16", intermediate_size=64, **shape)
    write_tiny_model(str(big), dtype="F16", intermediate_size=64 + 8192, **shape)
    extra = 2 * 3 * 512 * 8192 * 2  # layers x (gate, up, down) x weights x float16 bytes
    grown = peak_rss.generate_peak_rss(big, kv_cache_memory="8M") - \
        peak_rss.generate_peak_rss(small, kv_cache_memory="8M")
    assert 0.9 * extra < grown < 2.5 * extra, (grown >> 20, extra >> 20)
    with pytest.raises(RuntimeError, match="model folder not found"):
        peak_rss.generate_peak_rss(tmp_path / "missing")


@njit(parallel=True)
def _thread_of_each_half(owners):
    for c in prange(2):
        owners[c] = get_thread_id()


def test_the_cross_core_probe_reads_what_the_other_thread_wrote():
    """Its premise: a prange(2) gives its halves to numba's threads 0 (the caller) and 1,
    as the probe's writer does; and its figure, ns a line, is a finite number >= 0."""
    owners = np.full(2, -1)
    _thread_of_each_half(owners)
    if get_num_threads() >= 2:
        assert list(owners) == [0, 1]
    ns = cross_core.cross_core_ns(repeats=5)
    assert np.isfinite(ns) and ns >= 0.0
