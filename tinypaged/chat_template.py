"""Chat templates as models ship them: the Jinja text of tokenizer_config.json's
`chat_template` (or GGUF's `tokenizer.chat_template`), rendered as transformers'
apply_chat_template renders it.

A template is untrusted input (it comes with a downloaded model), so it runs in
Jinja's ImmutableSandboxedEnvironment, as transformers runs it: no attribute of
Python's internals, no mutation of the messages. On top of that a budget cuts off a
template that loops or explodes: at most MAX_RANGE items from range() in all, no
string or list built by `*` past MAX_OUTPUT characters, and at most MAX_OUTPUT
characters rendered. The names templates use: messages, add_generation_prompt,
bos_token, eos_token, tools, raise_exception(), strftime_now(), the tojson filter.
A template that raises names the message at fault: the first prefix of the
conversation that makes it raise ends with it.
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

MAX_RANGE = 100_000  # range() items a render may take, all calls together
MAX_OUTPUT = 1_000_000  # characters a render may produce (and the longest `*` result)


class TemplateError(ValueError):
    """A chat template that raised, looped, or exploded."""


class _Budget:
    def __init__(self):
        self.range_left = MAX_RANGE

    def range(self, *args):
        r = range(*args)
        self.range_left -= len(r)
        if self.range_left < 0:
            raise TemplateError(f"the chat template asked for more than {MAX_RANGE} loop "
                                f"items; cut off")
        return r


@lru_cache(maxsize=32)
def _compile(template: str):
    from jinja2 import TemplateSyntaxError, ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**"})

        def call_binop(self, context, operator, left, right):
            if operator == "**" and isinstance(right, (int, float)) and abs(right) > 64:
                raise TemplateError(f"the chat template raises a number to the power {right}; "
                                    f"cut off")
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int) \
                            and len(seq) * n > MAX_OUTPUT:
                        raise TemplateError(f"the chat template builds a value of "
                                            f"{len(seq) * n} items; cut off")
            return super().call_binop(context, operator, left, right)

    env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True,
                             extensions=[ext.loopcontrols])
    env.filters["tojson"] = _tojson
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
    template that raises, at which message."""
    try:
        return _render(template, messages, add_generation_prompt, names)
    except _Raised as e:
        at = _message_at_fault(template, messages, add_generation_prompt, names)
        where = f" at message {at} (role {messages[at].get('role')!r})" if at is not None else ""
        raise TemplateError(f"the chat template refused the conversation{where}: {e}") from None


def _render(template: str, messages, add_generation_prompt: bool, names: dict) -> str:
    from jinja2 import TemplateError as JinjaError
    from jinja2.exceptions import SecurityError

    compiled = _compile(template)
    budget = _Budget()
    out, size = [], 0
    try:
        for chunk in compiled.generate(messages=messages, add_generation_prompt=add_generation_prompt,
                                       range=budget.range, **names):
            size += len(chunk)
            if size > MAX_OUTPUT:
                raise TemplateError(f"the chat template rendered more than {MAX_OUTPUT} "
                                    f"characters; cut off")
            out.append(chunk)
    except (_Raised, TemplateError):
        raise
    except SecurityError as e:
        raise TemplateError(f"the chat template tried something the sandbox forbids: {e}") from None
    except (JinjaError, TypeError, ValueError, KeyError, IndexError, AttributeError,
            ZeroDivisionError, OverflowError, RecursionError, MemoryError) as e:
        raise TemplateError(f"the chat template failed: {type(e).__name__}: {e}") from None
    return "".join(out)


def _message_at_fault(template: str, messages, add_generation_prompt: bool, names: dict):
    """The index of the message whose arrival makes the template raise, or None."""
    for end in range(1, len(messages) + 1):
        try:
            _render(template, messages[:end], add_generation_prompt, names)
        except _Raised:
            return end - 1
        except TemplateError:
            return None
    return None
