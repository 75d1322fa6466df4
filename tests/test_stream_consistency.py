"""A streamed answer is the non-streamed one, cut into pieces: never a piece taken back,
never a piece sent twice, whatever the stop strings (issue 18, A4: a stop string
longer than the text so far made the stream start again from the beginning)."""
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serving import running_server, running_tiny_chat_server, sse_events
from tinypaged import SamplingParams
from tinypaged.engine.request import SampleText

PROPERTY = settings(max_examples=25, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def stories(stories_dir):
    yield from running_server(stories_dir, served_model_name="stories")


@pytest.fixture(scope="module")
def tiny_chat(tmp_path_factory):
    yield from running_tiny_chat_server(tmp_path_factory.mktemp("streams") / "tiny")


def stop_strings(reference: str):
    """Any text up to 80 characters, or a piece of what the model would say anyway."""
    anywhere = st.text(alphabet="abcdefghijklmnopqrstuvwxyz ,.Q", min_size=1, max_size=80)
    piece = st.tuples(st.integers(0, max(0, len(reference) - 1)),
                      st.integers(1, 60)).map(lambda a: reference[a[0]:a[0] + a[1]] or "Q")
    return st.lists(st.one_of(anywhere, piece), min_size=1, max_size=3)


def streamed_texts(url: str, body: dict, key) -> dict[int, str]:
    r = httpx.post(url, json={**body, "stream": True}, timeout=120)
    assert r.status_code == 200, r.text
    texts: dict[int, str] = {}
    for event in sse_events(r.text):
        for choice in event["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + (key(choice) or "")
    return texts


def whole_texts(url: str, body: dict, key) -> dict[int, str]:
    r = httpx.post(url, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return {choice["index"]: key(choice) for choice in r.json()["choices"]}


STORY = "Once upon a time, there was a little girl named Lily. She loved to play"


@PROPERTY
@given(data=st.data())
def test_completions_streamed_equal_whole_for_any_stop(stories, data):
    stop = data.draw(stop_strings(STORY), label="stop")
    body = {"prompt": "Once upon a time", "max_tokens": 30, "temperature": 0.8, "seed": 5,
            "n": 2, "stop": stop}
    url = stories.url + "/v1/completions"
    text = lambda choice: choice["text"]  # noqa: E731
    assert streamed_texts(url, body, text) == whole_texts(url, body, text)


@PROPERTY
@given(data=st.data())
def test_chat_streamed_equals_whole_for_any_stop(tiny_chat, data):
    stop = data.draw(stop_strings("the the Ġthe hello"), label="stop")
    body = {"messages": [{"role": "user", "content": "the the"}], "max_tokens": 20,
            "temperature": 1.0, "seed": 11, "stop": stop}
    url = tiny_chat.url + "/v1/chat/completions"
    streamed = streamed_texts(url, body, lambda choice: choice["delta"].get("content"))
    assert streamed == whole_texts(url, body, lambda choice: choice["message"]["content"])


class OneCharacterATokenizer:
    """A detokenizer stand-in: token t is the character chr(t)."""

    def detokenizer(self, context=(), skip_special_tokens=True):
        return self

    def push(self, token_id: int) -> str:
        return chr(token_id)

    def flush(self) -> str:
        return ""


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet="ab", max_size=40),
       stop=st.lists(st.text(alphabet="ab", min_size=1, max_size=50), min_size=1, max_size=3))
def test_what_a_stream_shows_only_grows_and_ends_as_the_whole_text(text, stop):
    sample = SampleText(OneCharacterATokenizer(), SamplingParams(stop=stop), [])
    shown = ""
    for ch in text:
        stopped = sample.push(ord(ch))
        if stopped:
            break
        assert sample.visible.startswith(shown)  # nothing taken back
        shown = sample.visible
    sample.finish()
    assert sample.visible.startswith(shown)
    assert not any(s in sample.visible for s in stop)
