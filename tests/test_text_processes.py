"""The server's large text work in child processes (serve/text_processes.py): the same
ids, text and errors as the model's own tokenizer, a job past its budget kills its
child, a child that stops is replaced, small inputs never leave the calling thread."""
import os
import signal
import threading

import pytest

from helpers import write_tiny_model
from serving import wait_until
from tinypaged.serve.text_processes import INLINE_CHARS, TextWork, WorkCutOff
from tinypaged.tokenizer import Tokenizer

STORY = "Once upon a time, there was a little girl named Lily. She loved to play outside. "


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A tiny model with a byte-level tokenizer and a ChatML template."""
    folder = str(tmp_path_factory.mktemp("tiny-chat"))
    write_tiny_model(folder, seed=3, max_position_embeddings=512)
    return folder


@pytest.fixture
def work(stories_dir):
    work = TextWork(Tokenizer(stories_dir), stories_dir, processes=1, budget=120.0)
    yield work
    work.close()


def child_pid(work: TextWork) -> int | None:
    """The idle child's pid (None when no child is up)."""
    if work._idle.empty():
        return None
    child = work._idle.get_nowait()
    work._idle.put(child)
    assert child.process.is_alive()
    return child.process.pid


def test_large_inputs_go_to_a_child_and_come_back_as_the_tokenizer_makes_them(work):
    text = STORY * (INLINE_CHARS // len(STORY) + 40)
    assert work.encode(STORY) == work.tokenizer.encode(STORY)
    assert child_pid(work) is None  # a small input stayed in this thread
    ids = work.encode(text)
    assert ids == work.tokenizer.encode(text) and ids[0] == work.tokenizer.encode("")[0]
    pid = child_pid(work)
    assert pid is not None and pid != os.getpid()
    assert work.encode(text, add_special_tokens=False) == ids[1:]
    assert work.decode(ids) == work.tokenizer.decode(ids)
    assert work.decode(ids, skip_special_tokens=False) == work.tokenizer.decode(ids, False)
    assert child_pid(work) == pid  # one child served them all


def test_a_conversation_renders_in_a_child_as_the_template_renders_it(chat_model):
    tokenizer = Tokenizer(chat_model)
    work = TextWork(tokenizer, chat_model, processes=1, budget=120.0)
    try:
        messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"}
                    for i in range(400)]
        tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
        assert work.chat_ids(messages) == tokenizer.chat_ids(messages)
        assert work.chat_ids(messages, False, tools) == tokenizer.chat_ids(messages, False, tools)
        assert child_pid(work) is not None
        messages.append({"role": 3, "content": "x"})
        with pytest.raises((ValueError, TypeError)) as here:
            tokenizer.chat_ids(messages)
        with pytest.raises(type(here.value)) as there:
            work.chat_ids(messages)
        assert str(there.value) == str(here.value)
    finally:
        work.close()


def test_errors_come_back_with_their_type_and_message(work):
    bad = STORY * (INLINE_CHARS // len(STORY) + 1) + "\ud800"
    with pytest.raises(ValueError) as here:
        work.tokenizer.encode(bad)
    with pytest.raises(ValueError) as there:
        work.encode(bad)
    assert str(there.value) == str(here.value) and "surrogate" in str(here.value)
    assert work.encode(STORY * 200) == work.tokenizer.encode(STORY * 200)  # the child goes on


def test_a_job_past_its_budget_kills_its_child_and_the_next_gets_a_fresh_one(work):
    text = STORY * 50_000  # 4 MB: seconds of tokenizing
    work.start()
    first = work._idle.get_nowait()
    work._idle.put(first)
    work.budget = 0.01
    with pytest.raises(WorkCutOff, match=r"^tokenizing took more than 0.01 s; cut off$"):
        work.encode(text)
    first.process.join(10)
    assert not first.process.is_alive()
    work.budget = 120.0
    assert work.encode(STORY * 200) == work.tokenizer.encode(STORY * 200)
    assert child_pid(work) not in (None, first.process.pid)


def test_a_child_that_stops_is_replaced(work):
    work.start()
    os.kill(child_pid(work), signal.SIGKILL)
    with pytest.raises(WorkCutOff, match="stopped its worker process"):
        work.encode(STORY * 200)
    assert work.encode(STORY * 200) == work.tokenizer.encode(STORY * 200)


def test_closed_work_starts_no_child(work):
    work.close()
    with pytest.raises(RuntimeError, match="shutting down"):
        work.encode(STORY * 200)
    assert work.encode(STORY) == work.tokenizer.encode(STORY)  # (small: this thread)


def test_a_child_busy_at_close_is_stopped_when_its_call_ends(work):
    work.start()
    child = work._idle.get_nowait()
    work._idle.put(child)
    release, real = threading.Event(), child.call

    def held(request, timeout):
        assert release.wait(60)
        return real(request, timeout)
    child.call = held
    results = []
    caller = threading.Thread(target=lambda: results.append(work.encode(STORY * 200)))
    caller.start()
    wait_until(work._idle.empty, what="the call to take the child")
    work.close()
    release.set()
    caller.join(60)
    assert results == [work.tokenizer.encode(STORY * 200)]
    child.process.join(10)
    assert not child.process.is_alive()
