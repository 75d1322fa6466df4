"""The benchmark's measuring tools: the llama.cpp peer's output parsing (against
stand-in executables that print what llama-bench and llama-batched-bench print) and
the peak-RSS probe of a real `cli.py generate` run."""
import json
import stat

import pytest

from tinypaged.bench import llama_cpp_peer, peak_rss


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


def test_peak_rss_of_a_real_generate_run(stories_dir):
    rss = peak_rss.generate_peak_rss(stories_dir, kv_cache_memory="8M")
    assert 50 << 20 < rss < 2 << 30  # Python + NumPy + numba alone take ~90 MiB
    with pytest.raises(RuntimeError, match="model folder not found"):
        peak_rss.generate_peak_rss(stories_dir / "missing")
