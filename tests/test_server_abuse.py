"""The server under abuse (issue 18, part A): one client cannot starve the others by
what it puts in the queue, how many connections it holds, or how much it makes the
server build; and nothing a client sends turns into a 500."""
import threading

import httpx
import pytest

from helpers import slow_down
from serving import ServerThread, wait_until
from test_server_errors import COMPLETIONS, assert_openai_error
from tinypaged import LLM

LONG = {"prompt": "Once upon a time", "max_tokens": 300, "ignore_eos": True}


@pytest.fixture
def one_seat(stories_dir, monkeypatch):
    """A server whose engine runs two sequences at a time, slowly."""
    llm = LLM(stories_dir, backend="cpu", kv_cache_memory=4 << 20, max_num_seqs=2)
    slow_down(llm, monkeypatch)
    servers = []

    def start(**config):
        servers.append(ServerThread(llm, **config))
        return servers[-1]
    yield start
    for server in servers:
        server.stop()
    llm.close()


# -- A1: the queue ---------------------------------------------------------------------------

def test_a_batch_of_prompts_counts_prompts_times_n_against_max_waiting(one_seat):
    server = one_seat(max_waiting=4)
    llm = server.llm
    with httpx.stream("POST", server.url + COMPLETIONS, json={**LONG, "stream": True, "n": 2},
                      timeout=60) as running:
        lines = running.iter_lines()
        next(lines)  # its two samples hold both seats
        too_many = httpx.post(server.url + COMPLETIONS, json={**LONG, "prompt": ["a", "b", "c"],
                                                             "n": 2, "max_tokens": 2})
        error = assert_openai_error(too_many, 400, "prompt")
        assert "6 sequences (3 prompts x n=2)" in error["message"] and "at most 4" in error["message"]
        waiting = []
        thread = threading.Thread(target=lambda: waiting.append(httpx.post(
            server.url + COMPLETIONS, json={**LONG, "prompt": ["a", "b"], "n": 1, "max_tokens": 2},
            timeout=120)))
        thread.start()
        wait_until(lambda: llm.num_waiting_samples == 2, what="two waiting prompts", timeout=60)
        refused = httpx.post(server.url + COMPLETIONS, json={**LONG, "prompt": ["c", "d", "e"],
                                                             "max_tokens": 2})
        assert assert_openai_error(refused, 503)["code"] == "server_overloaded"
        fits = threading.Thread(target=lambda: waiting.append(httpx.post(
            server.url + COMPLETIONS, json={**LONG, "prompt": "c", "n": 2, "max_tokens": 2},
            timeout=120)))  # 2 + 2 = 4: within the limit
        fits.start()
        wait_until(lambda: llm.num_waiting_samples == 4, what="four waiting samples", timeout=60)
    thread.join(timeout=120)
    fits.join(timeout=120)
    assert [r.status_code for r in waiting] == [200, 200]
    assert llm.stats()["blocks_used"] == 0


def test_a_request_with_too_many_prompts_is_refused_before_tokenizing(one_seat):
    server = one_seat(max_prompts_per_request=8)
    r = httpx.post(server.url + COMPLETIONS, json={"prompt": [[1]] * 9, "max_tokens": 1})
    assert "9 prompts in one request; this server takes at most 8" in \
        assert_openai_error(r, 400, "prompt")["message"]
    r = httpx.post(server.url + COMPLETIONS, json={"prompt": [[1]] * 8, "max_tokens": 1},
                   timeout=60)
    assert r.status_code == 200 and len(r.json()["choices"]) == 8
