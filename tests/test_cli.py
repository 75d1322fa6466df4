"""The command line: outputs on a tiny model, and one clear line for every user mistake."""
import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tinypaged import LLM, SamplingParams
from tinypaged.model.reference import ReferenceModel
from tinypaged.model.loading import load_model
from tinypaged.tokenizer import Tokenizer
from tinypaged.perplexity import perplexity

CLI = Path(__file__).resolve().parents[1] / "cli.py"


ENGINE_COMMANDS = ("generate", "serve", "perplexity")


def run_cli(*args, env=None):
    """cli.py with args; an engine command runs on the CPU unless args name a backend
    (a GPU host's "auto" would be CUDA, whose bits differ from the library's here)."""
    args = [str(a) for a in args]
    if args and args[0] in ENGINE_COMMANDS and "--backend" not in args:
        args += ["--backend", "cpu"]
    return subprocess.run([sys.executable, str(CLI), *args],
                          capture_output=True, text=True, timeout=300, env=env)


def assert_one_line_error(result, pattern):
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and re.search(pattern, lines[0]), lines[0]


def test_generate_streams_the_library_output(tiny_model_dir):
    result = run_cli("generate", "hello there", "--model", tiny_model_dir,
                     "--max-tokens", 6, "--temperature", 0, "--verbose")
    assert result.returncode == 0, result.stderr
    expected = LLM(tiny_model_dir).generate("hello there", SamplingParams(max_tokens=6, temperature=0))
    assert result.stdout == expected[0].text + "\n"
    assert re.search(r"loaded .* in \d+\.\d\d s", result.stderr)


def test_generate_under_a_schema_or_a_choice(tiny_model_dir, tmp_path):
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "object", "additionalProperties": false, "required": ["n"], '
                      '"properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}}')
    result = run_cli("generate", "hi", "--model", tiny_model_dir, "--json-schema", f"@{schema}",
                     "--max-tokens", 16)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["n"] in range(10)
    result = run_cli("generate", "hi", "--model", tiny_model_dir, "--choice", "red", "blue green")
    assert result.returncode == 0 and result.stdout in ("red\n", "blue green\n"), result


def test_generate_with_chat_and_prompt_option(tiny_model_dir):
    result = run_cli("generate", "--prompt", "hi", "--chat", "--model", tiny_model_dir,
                     "--max-tokens", 4, "--temperature", 0.8, "--top-k", 5, "--top-p", 0.9,
                     "--seed", 1)
    assert result.returncode == 0, result.stderr
    llm = LLM(tiny_model_dir)
    chat = llm.chat([{"role": "user", "content": "hi"}],
                    SamplingParams(max_tokens=4, temperature=0.8, top_k=5, top_p=0.9, seed=1))[0]
    assert result.stdout == chat.text + "\n"


def perplexity_printed(result) -> float:
    assert result.returncode == 0, result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"perplexity: \d+\.\d{3}", last)
    return float(last.split()[1])


def test_perplexity_runs_through_the_engine_and_agrees_with_the_reference(tiny_model_dir, tmp_path):
    text_file = tmp_path / "t.txt"
    text_file.write_text("the cat sat on the mat, and then the cat slept. " * 3)  # > one window
    ids = Tokenizer(tiny_model_dir).encode(text_file.read_text())
    expected = perplexity(ReferenceModel(*load_model(tiny_model_dir)), ids)
    engine = perplexity_printed(run_cli("perplexity", "--model", tiny_model_dir, "--file", text_file))
    reference = perplexity_printed(run_cli("perplexity", "--model", tiny_model_dir, "--file",
                                           text_file, "--reference"))
    options = perplexity_printed(run_cli(  # every engine option is honoured; same figure
        "perplexity", "--model", tiny_model_dir, "--file", text_file, "--block-size", 4,
        "--max-num-batched-tokens", 7, "--no-prefix-caching", "--kv-cache-memory", "1M",
        "--max-num-seqs", 2, "--backend", "cpu"))
    assert engine == pytest.approx(expected, abs=2e-3) and reference == pytest.approx(expected, abs=1e-3)
    assert options == pytest.approx(engine, abs=2e-3)


def test_perplexity_of_a_uniform_model_is_the_vocab_size(tiny_model_dir):
    cfg, weights = load_model(tiny_model_dir)
    weights["lm_head.weight"] = np.zeros_like(weights["lm_head.weight"])
    ppl = perplexity(ReferenceModel(cfg, weights), list(range(3, 40)))
    assert ppl == pytest.approx(cfg.vocab_size, rel=1e-5)


@pytest.mark.parametrize("args, pattern", [
    (["--top-p", "1.5"], r"top_p=1\.5 must be in \(0, 1\]"),
    (["--temperature", "-1"], "temperature=-1.0 must be >= 0"),
    (["--max-tokens", "0"], "max_tokens=0"),
    (["--top-k", "-2"], "top_k=-2"),
    (["--max-tokens", "many"], "invalid int value: 'many'"),
    (["--regex", "("], "unclosed group"),
    (["--choice", "a", "--regex", "b"], "exactly one of"),
])
def test_bad_sampling_arguments(tiny_model_dir, args, pattern):
    assert_one_line_error(run_cli("generate", "hi", "--model", tiny_model_dir, *args), pattern)


def test_bad_prompts(tiny_model_dir):
    assert_one_line_error(run_cli("generate", "", "--model", tiny_model_dir), "prompt is empty")
    assert_one_line_error(run_cli("generate", "--model", tiny_model_dir), "no prompt")
    long_prompt = "word " * 80
    assert_one_line_error(run_cli("generate", long_prompt, "--model", tiny_model_dir),
                          r"prompt has \d+ tokens; max_model_len is 64 tokens")


def test_missing_and_corrupt_model_files(tiny_model_dir, tmp_path):
    assert_one_line_error(run_cli("generate", "hi", "--model", tmp_path / "nowhere"),
                          "model folder not found")
    weights = tiny_model_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-500])
    assert_one_line_error(run_cli("generate", "hi", "--model", tiny_model_dir),
                          "truncated safetensors file")
    weights.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    assert_one_line_error(run_cli("generate", "hi", "--model", tiny_model_dir),
                          "corrupt safetensors header")
    assert_one_line_error(run_cli("perplexity", "--model", tiny_model_dir, "--file",
                                  tmp_path / "absent.txt"), "absent.txt")


def test_convert_errors(tmp_path):
    assert_one_line_error(run_cli("convert", tmp_path / "absent.gguf", tmp_path / "out"),
                          "GGUF file not found")
    (tmp_path / "bad.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x01" * 10)
    assert_one_line_error(run_cli("convert", tmp_path / "bad.gguf", tmp_path / "out"),
                          "truncated GGUF file")
    assert not (tmp_path / "out").exists()


def test_unknown_command_and_option():
    assert_one_line_error(run_cli("fly"), "invalid choice: 'fly'")
    assert_one_line_error(run_cli("generate", "hi", "--bogus"), "unrecognized arguments: --bogus")


def test_batch_of_prompts_with_samples_stop_and_stats(tiny_model_dir, tmp_path):
    prompts_file = tmp_path / "prompts.txt"
    prompts_file.write_text("one more\n\nsecond prompt\n")
    result = run_cli("generate", "--prompt", "first", "--prompts-file", prompts_file,
                     "--model", tiny_model_dir, "--n", 2, "--temperature", 0.7, "--seed", 3,
                     "--max-tokens", 5, "--block-size", 4, "--kv-cache-memory", "1M",
                     "--no-prefix-caching", "--ignore-eos", "--stats")
    assert result.returncode == 0, result.stderr
    headers = re.findall(r"^--- prompt (\d), sample (\d) \((\w+)\) ---$", result.stdout, re.M)
    assert headers == [(str(p), str(s), "length") for p in range(3) for s in range(2)]
    stats = dict(re.findall(r"^(\w+): (\S+)$", result.stdout, re.M))
    assert int(stats["block_size"]) == 4 and int(stats["blocks_used"]) == 0
    assert int(stats["kv_cache_bytes"]) <= 1 << 20
    assert int(stats["prefix_cache_query_tokens"]) == 0  # caching was off
    llm = LLM(tiny_model_dir, block_size=4)
    expected = llm.generate(["first", "one more", "second prompt"],
                            SamplingParams(n=2, temperature=0.7, seed=3, max_tokens=5,
                                           ignore_eos=True))
    texts = re.split(r"^--- prompt \d, sample \d \(\w+\) ---\n", result.stdout.split("\n\nblocks_total")[0],
                     flags=re.M)[1:]
    assert [t.rstrip("\n") for t in texts] == [s.text for out in expected for s in out.outputs]


def test_stop_string_on_the_command_line(tiny_model_dir):
    free = LLM(tiny_model_dir).generate("abc", SamplingParams(temperature=0, max_tokens=12,
                                                              ignore_eos=True))[0].text
    stop = free[4:6]
    result = run_cli("generate", "abc", "--model", tiny_model_dir, "--temperature", 0,
                     "--max-tokens", 12, "--ignore-eos", "--stop", stop)
    assert result.returncode == 0, result.stderr
    assert result.stdout == free[:free.index(stop)] + "\n"


def test_bad_engine_arguments(tiny_model_dir):
    assert_one_line_error(run_cli("generate", "hi", "--model", tiny_model_dir, "--block-size", 0),
                          "block_size=0")
    assert_one_line_error(run_cli("generate", "hi", "--model", tiny_model_dir,
                                  "--kv-cache-memory", "lots"), "invalid size")
    assert_one_line_error(run_cli("generate", "hi", "--model", tiny_model_dir, "--n", 0), "n=0")
    assert_one_line_error(run_cli("generate", "--model", tiny_model_dir, "--prompts-file",
                                  "/nonexistent/prompts.txt"), "prompts.txt")


@pytest.mark.parametrize("args, pattern", [
    (["--kv-cache-memory", "100T"], r"a KV pool of \d+ blocks x .* needs [\d.]+ TiB, and only "
                                    r".* is available: lower num_blocks or kv_cache_memory"),
    (["--kv-cache-memory", "infG"], "invalid size 'infG'"),
    (["--kv-cache-memory=-1M"], "invalid size '-1M'"),
    (["--beam-width", "3", "--n", "2"], "--beam-width 3 returns that many beams .* give one"),
])
def test_sizes_and_conflicts_are_one_line(tiny_model_dir, args, pattern):
    assert_one_line_error(run_cli("generate", "hi", "--model", tiny_model_dir, *args), pattern)


def test_a_prompts_file_that_is_not_utf8_is_one_line(tiny_model_dir, tmp_path):
    (tmp_path / "p.txt").write_bytes(b"fine\ncaf\xe9\n")
    assert_one_line_error(run_cli("generate", "--model", tiny_model_dir, "--prompts-file",
                                  tmp_path / "p.txt"), r"p\.txt is not UTF-8 text \(byte 8: b'\\xe9'\)")


def test_an_undecodable_prompt_is_one_line(tiny_model_dir):
    result = subprocess.run([sys.executable, str(CLI), "generate", b"caf\xe9 \xff",
                             "--model", str(tiny_model_dir)], capture_output=True, timeout=300)
    result.stderr = result.stderr.decode()
    assert_one_line_error(result, "prompt is not valid text: '\\\\udce9' at character 3")


def test_cuda_backend_without_a_gpu(tiny_model_dir):
    import os
    from tinypaged.kernels.cuda import cuda_usable
    if cuda_usable():
        pytest.skip("a GPU is present")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    assert_one_line_error(run_cli("generate", "hi", "--model", tiny_model_dir, "--backend", "cuda",
                                  env=env), "backend='cuda' needs an NVIDIA GPU")


def test_beam_width_and_show_blocks(tiny_model_dir):
    result = run_cli("generate", "hello", "--model", tiny_model_dir, "--beam-width", 3,
                     "--max-tokens", 4, "--ignore-eos", "--block-size", 2, "--show-blocks")
    assert result.returncode == 0, result.stderr
    beams = re.findall(r"^--- prompt 0, beam (\d) \(cumulative logprob (-?\d+\.\d+), length\) ---$",
                       result.stdout, re.M)
    assert [b[0] for b in beams] == ["0", "1", "2"]
    assert [float(b[1]) for b in beams] == sorted((float(b[1]) for b in beams), reverse=True)
    want = LLM(tiny_model_dir, block_size=2).beam_search("hello", 3, 4, ignore_eos=True)[0]
    assert [round(b.cum_logprob, 3) for b in want.beams] == [float(b[1]) for b in beams]
    assert "At the peak of the run:\nKV pool:" in result.stdout and "After the run:" in result.stdout


def test_serve_mistakes_are_one_line(tiny_model_dir):
    assert_one_line_error(run_cli("serve", "--model", tiny_model_dir, "--max-waiting", 0),
                          r"max_waiting=0 must be an integer >= 1")
    assert_one_line_error(run_cli("serve", "--model", tiny_model_dir, "--port", 70000),
                          r"port=70000")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert_one_line_error(run_cli("serve", "--model", tiny_model_dir, "--port", port),
                              rf"cannot listen on 127.0.0.1:{port}: Address already in use")
    assert_one_line_error(run_cli("serve", "--model", "/no/such/model"), r"/no/such/model")


def test_quantization_on_the_command_line(tiny_model_dir):
    result = run_cli("generate", "hello there", "--model", tiny_model_dir, "--max-tokens", 6,
                     "--temperature", 0, "--quantization", "q8_0")
    assert result.returncode == 0, result.stderr
    expected = LLM(tiny_model_dir, quantization="q8_0").generate(
        "hello there", SamplingParams(max_tokens=6, temperature=0))
    assert result.stdout == expected[0].text + "\n"
    assert_one_line_error(run_cli("generate", "hi", "--model", tiny_model_dir, "--quantization",
                                  "q2"), "invalid choice: 'q2'")


def test_kv_cache_dtype_on_the_command_line(tiny_model_dir):
    result = run_cli("generate", "hello there", "--model", tiny_model_dir, "--max-tokens", 6,
                     "--temperature", 0, "--kv-cache-dtype", "float16")
    assert result.returncode == 0, result.stderr
    expected = LLM(tiny_model_dir, kv_cache_dtype="float16").generate(
        "hello there", SamplingParams(max_tokens=6, temperature=0))
    assert result.stdout == expected[0].text + "\n"
    assert_one_line_error(run_cli("generate", "hi", "--model", tiny_model_dir, "--kv-cache-dtype",
                                  "int4"), "invalid choice: 'int4'")
    assert_one_line_error(run_cli("generate", "hi", "--model", tiny_model_dir, "--kv-cache-dtype",
                                  "int8"), "head_dim=8 is not a multiple of 32: use float16")


def test_generate_speculates_as_told_and_refuses_a_bad_config_in_one_line(stories_dir):
    """--speculative-config takes vLLM's JSON: greedy output is plain decoding's; bad
    JSON and an unknown key are one line each."""
    prompt = "Tom and Sue went to the park. Tom and Sue"
    plain = run_cli("generate", prompt, "--model", stories_dir, "--max-tokens", 40, "--temperature", 0)
    spec = run_cli("generate", prompt, "--model", stories_dir, "--max-tokens", 40, "--temperature", 0,
                   "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}')
    assert spec.returncode == 0 and spec.stdout == plain.stdout and plain.stdout.strip(), spec.stderr
    assert_one_line_error(run_cli("generate", "hi", "--model", stories_dir, "--speculative-config",
                                  '{"method": "ngram"'), "speculative_config is not valid JSON")
    assert_one_line_error(run_cli("generate", "hi", "--model", stories_dir, "--speculative-config",
                                  '{"method": "ngram", "num_speculative_tokens": 4, "n": 1}'),
                          r"unknown keys \['n'\]")


def test_the_installed_command_and_python_m_run_the_same_code(tiny_model_dir):
    """`tinypaged` (the console script pip installs beside the interpreter) and `python -m
    tinypaged` give cli.py's output; their errors name themselves."""
    args = ["generate", "hello there", "--model", str(tiny_model_dir), "--max-tokens", "6",
            "--temperature", "0", "--backend", "cpu"]
    want = run_cli(*args)
    assert want.returncode == 0, want.stderr
    script = Path(sys.executable).parent / "tinypaged"
    assert script.is_file(), "pip install -e . makes the tinypaged command"
    for command, prog in (([str(script)], "tinypaged"), ([sys.executable, "-m", "tinypaged"],
                                                          "python -m tinypaged")):
        got = subprocess.run(command + args, capture_output=True, text=True, timeout=300)
        assert got.returncode == 0 and got.stdout == want.stdout, got.stderr
        bad = subprocess.run(command + ["generate", "--bogus"], capture_output=True, text=True,
                             timeout=300)
        assert_one_line_error(bad, re.escape(f"(see {prog} --help)"))


def test_generate_with_a_lora_adapter_and_its_mistakes_in_one_line(tmp_path):
    from test_hf_parity import model_folder
    folder = model_folder("qwen3", "config.json", tmp_path)
    adapter = Path(__file__).parent / "fixtures" / "lora" / "qwen3-r16"
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    llm = LLM(folder, backend="cpu", lora_modules={"a": str(adapter)})
    want = llm.generate("t5", params, lora="a")[0].outputs[0].text
    assert want != llm.generate("t5", params)[0].outputs[0].text
    llm.close()
    result = run_cli("generate", "t5", "--model", folder, "--lora", adapter, "--max-tokens", 6,
                     "--temperature", 0, "--ignore-eos")
    assert result.returncode == 0, result.stderr
    assert result.stdout == want + "\n"
    assert_one_line_error(run_cli("generate", "t5", "--model", folder, "--lora",
                                  Path(__file__).parent / "fixtures" / "lora" / "llama-r4"),
                          r"made for LlamaForCausalLM; this model is a Qwen3ForCausalLM")
    assert_one_line_error(run_cli("generate", "t5", "--model", folder, "--lora", adapter,
                                  "--beam-width", 2), r"--beam-width runs the base model")
    assert_one_line_error(run_cli("serve", "--model", folder, "--lora-modules", "nameonly"),
                          r"'nameonly' is not name=path")
