"""Chat templates as models ship them, rendered as transformers renders them
(fixtures by tools/make_chat_fixtures.py), in a sandbox that cuts off a template
that loops or explodes, with errors that name the message at fault."""
import json
from pathlib import Path

import pytest

from tinypaged import LLM, SamplingParams
from tinypaged.chat_template import TemplateError, render

FOLDER = Path(__file__).parent / "fixtures" / "chat_templates"
EXPECTED = json.loads((FOLDER / "expected.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", EXPECTED, ids=lambda c: f"{c['template']}-{len(c['messages'])}"
                         f"{'-gen' if c['add_generation_prompt'] else ''}")
def test_renders_as_transformers_does(case):
    template = (FOLDER / f"{case['template']}.jinja").read_text(encoding="utf-8")
    got = render(template, case["messages"], case["add_generation_prompt"],
                 bos_token=case["bos_token"], eos_token=case["eos_token"])
    assert got == case["rendered"]


def test_a_template_that_raises_names_the_message_at_fault():
    template = (FOLDER / "gemma3.jinja").read_text(encoding="utf-8")
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                {"role": "assistant", "content": "c"}]
    with pytest.raises(TemplateError) as e:
        render(template, messages, bos_token="<bos>")
    message = str(e.value)
    assert "at message 2 (role 'assistant')" in message and "must alternate" in message
    assert "\n" not in message


@pytest.mark.parametrize("template, what", [
    ("{% for i in range(1000000) %}{% for j in range(1000000) %}x{% endfor %}{% endfor %}",
     "loop items"),
    ("{% for i in range(60000) %}{% for j in range(60000) %}{% endfor %}{% endfor %}", "loop items"),
    ("{{ 'x' * 1000000000 }}", "builds a value"),
    ("{{ [1] * 100000000 }}", "builds a value"),
    ("{{ 10 ** 100000000 }}", "power"),
    ("{% for m in messages %}{{ m.content * 600000 }}{% endfor %}", "builds a value"),
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "sandbox forbids"),
    ("{{ messages.append(1) }}", "sandbox forbids"),
    ("{% for i in range(5) %}", "does not parse"),
    ("{{ messages[0]['content'] | nosuchfilter }}", "does not parse"),
    ("{{ 1 / 0 }}", "ZeroDivisionError"),
    # issue 31's probes: each grows time or memory past the old range()-only budget
    ("{% set s = messages[0].content * 1000 %}{% for a in s %}{% for b in s %}{% endfor %}"
     "{% endfor %}", "loop items"),
    ("{{ 10 ** (64 ** 64) }}", "power"),
    ("{{ 10 ** 64 ** 64 ** 64 ** 64 }}", "power"),
    ("{{ lipsum(n=100000) }}", "lipsum"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
     "{% endfor %}{{ ns.s | length }}", "builds a string"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
     "{% endfor %}{{ ns.s | length }}", "builds a value"),
    ("{% set ns = namespace(s=[1]) %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
     "{% endfor %}", "builds a value"),
    ("{{ ([[[1] * 1000] * 1000] * 1000) | string }}", "builds a string"),
    ("{{ ([[[1] * 1000] * 1000] * 1000) | tojson }}", "builds a string"),
    ("{{ ([[[1] * 1000] * 1000] * 1000) | join(',') }}", "builds a string"),
    ("{{ [[[1] * 1000] * 1000] * 1000 }}", "builds an output"),
    ("{{ 'x' ~ [[[1] * 1000] * 1000] * 1000 }}", "builds a string"),
    ("{{ 'x'.ljust(10 ** 9) }}", "builds a string"),
    ("{{ ('ab' * 400000).replace('a', 'bbbbbbbbbb') }}", "builds a string"),
    ("{{ ('ab' * 400000) | replace('a', 'bbbbbbbbbb') }}", "builds a string"),
    ("{{ '%0999999999d' % 1 }}", "width"),
    ("{{ '%*d' % (999999999, 1) }}", "width"),
    ("{{ '{:>999999999}'.format(1) }}", "width"),
    ("{{ 'x' | center(10 ** 9) }}", "builds a string"),
    ("{{ ('x\n' * 1000) | indent(100000) }}", "builds a string"),
    ("{{ ','.join(['x' * 1000] * 1000) }}", "builds a string"),
])
def test_a_template_that_loops_explodes_or_escapes_is_cut_off(template, what):
    with pytest.raises(TemplateError, match=what):
        render(template, [{"role": "user", "content": "hi"}])


def test_a_render_stops_at_its_time_budget(monkeypatch):
    from tinypaged import chat_template
    monkeypatch.setattr(chat_template, "MAX_SECONDS", 0.01)
    with pytest.raises(TemplateError, match="ran for more than 0.01 s"):
        render("{% for i in range(900000) %}{{ i }}{% endfor %}", [{"role": "user", "content": "hi"}])


def test_the_message_at_fault_is_found_in_one_render(monkeypatch):
    """A wrong role at message 2,999 of 3,000 costs one render, not 3,000."""
    from tinypaged import chat_template
    template = (FOLDER / "gemma3.jinja").read_text(encoding="utf-8")
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"}
                for i in range(3000)]
    messages[2999]["role"] = "user"
    renders = []
    real = chat_template._compile

    def counting(text):
        compiled = real(text)

        class Counted:
            def generate(self, **names):
                renders.append(1)
                return compiled.generate(**names)
        return Counted()
    monkeypatch.setattr(chat_template, "_compile", counting)
    with pytest.raises(TemplateError, match=r"at message 2999 \(role 'user'\).*alternate"):
        render(template, messages, bos_token="<bos>")
    assert len(renders) == 1


def test_a_long_conversation_still_renders():
    """The value and output limits grow with the conversation's own text."""
    template = (FOLDER / "smollm2.jinja").read_text(encoding="utf-8")
    messages = [{"role": "user", "content": "x" * 600_000},
                {"role": "assistant", "content": "y" * 600_000}]
    assert len(render(template, messages)) > 1_200_000


def test_a_bad_template_fails_its_chat_and_the_engine_lives_on(tiny_model_dir):
    config = tiny_model_dir / "tokenizer_config.json"
    settings = json.loads(config.read_text())
    settings["chat_template"] = "{% for i in range(10**6) %}{% for j in range(10**6) %}{% endfor %}{% endfor %}"
    config.write_text(json.dumps(settings))
    llm = LLM(tiny_model_dir, backend="cpu", num_blocks=64)
    with pytest.raises(ValueError, match="loop items"):
        llm.chat([{"role": "user", "content": "hi"}])
    out = llm.generate("hello", SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 3 and llm.stats()["blocks_used"] == 0


def test_the_templates_bos_is_not_added_twice(gemma3_gguf):
    """A template that writes BOS itself (Gemma 3's does, as the text <bos>) is encoded
    without the tokenizer adding another."""
    from tinypaged.tokenizer import Tokenizer
    tokenizer = Tokenizer(gemma3_gguf)
    tokenizer.chat_template = (FOLDER / "gemma3.jinja").read_text(encoding="utf-8")
    ids = tokenizer.chat_ids([{"role": "user", "content": "Hi"}])
    assert ids[0] == 2 and ids[1] != 2 and ids[1] == tokenizer.encode("<start_of_turn>", False)[0]


ROLES = ("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
         "{% if add_generation_prompt %}[assistant] {% endif %}")


def test_a_given_template_serves_a_model_that_ships_none(stories_dir, tmp_path):
    """vLLM's --chat-template: the template itself or its file, in place of the model's
    (stories260K ships none; the GGUF Gemma 3 270M users download neither); a model
    without one says where to give one."""
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(ValueError, match=r"no chat template .*chat_template= \(--chat-template"):
        LLM(stories_dir).chat_prompt(messages)
    path = tmp_path / "roles.jinja"
    path.write_text(ROLES, encoding="utf-8")
    for given in (ROLES, str(path)):
        llm = LLM(stories_dir, chat_template=given)
        assert llm.chat_prompt(messages) == "[user] hi\n[assistant] "
        ids = llm.chat_prompt_ids(messages)  # (the rendered text, no BOS added: it writes none)
        assert ids == llm.engine.tokenizer.encode("[user] hi\n[assistant] ", add_special_tokens=False)
        want = LLM(stories_dir).generate([ids], SamplingParams(temperature=0, max_tokens=5))
        assert llm.chat([messages], SamplingParams(temperature=0, max_tokens=5))[0].outputs[0].token_ids \
            == want[0].outputs[0].token_ids


@pytest.mark.parametrize("given, error, match", [
    ("roles.jinja", ValueError, r"'roles.jinja' is neither a file nor a Jinja template"),
    ("{% for m in messages %}{{ m.content }}", TemplateError, "does not parse"),
    (5, TypeError, "chat_template must be a str"),
])
def test_a_bad_given_template_is_refused_at_start(stories_dir, given, error, match):
    with pytest.raises(error, match=match):
        LLM(stories_dir, chat_template=given)


def test_the_server_and_the_cli_take_a_given_template(stories_dir, tmp_path):
    import httpx
    from serving import ServerThread

    messages = [{"role": "user", "content": "hi"}]
    plain, given = LLM(stories_dir, backend="cpu"), LLM(stories_dir, backend="cpu", chat_template=ROLES)
    for llm, status in ((plain, 400), (given, 200)):
        server = ServerThread(llm)
        try:
            r = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                           json={"messages": messages, "max_tokens": 4, "temperature": 0})
        finally:
            server.stop()
        assert r.status_code == status, r.text
        if status == 400:
            assert "--chat-template" in r.json()["error"]["message"]
    path = tmp_path / "roles.jinja"
    path.write_text(ROLES, encoding="utf-8")
    from test_cli import run_cli
    result = run_cli("generate", "hi", "--chat", "--chat-template", path, "--model", stories_dir,
                     "--max-tokens", 5, "--temperature", 0)
    want = given.chat([messages], SamplingParams(temperature=0, max_tokens=5))
    assert result.returncode == 0 and result.stdout == want[0].outputs[0].text + "\n", result.stderr
    plain.close()
    given.close()
