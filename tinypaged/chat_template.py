"""Chat templates as models ship them: the Jinja text of tokenizer_config.json's
`chat_template` (or GGUF's `tokenizer.chat_template`), rendered as transformers'
apply_chat_template renders it.

A template is untrusted input (it comes with a downloaded model), so it runs in
Jinja's ImmutableSandboxedEnvironment, as transformers runs it, under a budget
(template_budget.py): loop items, the size of every value it builds, and time.
The names templates use: messages, add_generation_prompt, bos_token, eos_token,
tools, raise_exception(), strftime_now(), the tojson filter. A template that raises
names the message it was reading.
"""
from __future__ import annotations

import json
import os
from datetime import datetime
from functools import lru_cache

from .template_budget import BoundedEnvironment, Budget, TemplateError

MAX_ITEMS = 1_000_000  # loop and range() items a render may take, all loops together
MAX_OUTPUT = 1_000_000  # characters a render may write (and the longest value it may build),
#   beyond twice the conversation's own characters
MAX_SECONDS = 5.0  # a render's time

__all__ = ["TemplateError", "given_template", "render"]


def given_template(value: str) -> str:
    """The template a user gave in place of the model's (vLLM's --chat-template): a
    file's path, read, or the template itself; ValueError where it is neither, or does
    not parse."""
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            text = f.read()
    elif "{{" in value or "{%" in value:
        text = value
    else:
        raise ValueError(f"chat_template {value!r:.80} is neither a file nor a Jinja template "
                         f"(no '{{{{' or '{{%' in it)")
    _compile(text)  # (TemplateError, a ValueError, names a syntax error)
    return text


@lru_cache(maxsize=32)
def _compile(template: str):
    from jinja2 import TemplateSyntaxError, ext

    env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[ext.loopcontrols])
    env.add_filter("tojson", _tojson)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except TemplateSyntaxError as e:
        raise TemplateError(f"the chat template does not parse: {e.message} (line {e.lineno})") from None


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """transformers' tojson: no HTML escaping (unlike Jinja's own), unicode kept."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


class _Raised(Exception):
    """raise_exception() from a template: its own message."""


def _raise(message):
    raise _Raised(str(message))


def render(template: str, messages: list[dict], add_generation_prompt: bool = True,
           **names) -> str:
    """The template rendered over messages; names: bos_token, eos_token, tools, and
    whatever else a template reads. A TemplateError says what went wrong, and for a
    template that raises, at which message (the one it was reading)."""
    from jinja2 import TemplateError as JinjaError
    from jinja2.exceptions import SecurityError

    compiled = _compile(template)
    own_chars = sum(len(str(m.get("content") or "")) for m in messages)
    limit = MAX_OUTPUT + 2 * own_chars
    out, size = [], 0
    with Budget(messages, MAX_ITEMS, limit, MAX_SECONDS) as budget:
        try:
            for chunk in compiled.generate(messages=messages, range=budget.range,
                                           add_generation_prompt=add_generation_prompt, **names):
                size += len(chunk)
                if size > limit:
                    raise TemplateError(f"the chat template rendered more than {limit:,} "
                                        f"characters; cut off")
                out.append(chunk)
        except _Raised as e:
            at = budget.reading
            where = f" at message {at} (role {messages[at].get('role')!r})" if at is not None else ""
            raise TemplateError(f"the chat template refused the conversation{where}: {e}") from None
        except TemplateError:
            raise
        except SecurityError as e:
            raise TemplateError(f"the chat template tried something the sandbox forbids: {e}") from None
        except (JinjaError, TypeError, ValueError, KeyError, IndexError, AttributeError,
                ZeroDivisionError, OverflowError, RecursionError, MemoryError) as e:
            raise TemplateError(f"the chat template failed: {type(e).__name__}: {e}") from None
    return "".join(out)
