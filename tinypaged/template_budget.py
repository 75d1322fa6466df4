"""A Jinja environment that bounds what a template may spend. A chat template comes
with a downloaded model: untrusted code. Jinja's ImmutableSandboxedEnvironment keeps
it from Python's internals and from changing its inputs, as transformers runs it;
this adds a budget, per render, on everything that can grow time or memory:

- loop items: every `for` loop's items and every range() item count against
  max_items (nested loops over a long string too);
- values: a string, list or dict that an operation would make longer than
  max_chars is refused before it is built: `*`, `+`, `~`, `%`, `**` (by the result's
  digits), str methods (ljust, center, zfill, replace, join, format, ...), filters
  (join, tojson, string, indent, center, replace, wordwrap, format, ...) and each
  `{{ value }}` written out (a nested list's text is estimated first);
- time: the render stops once `seconds` have passed (checked at every loop item,
  call, filter, operator and output);
- lipsum() is not there.

A template over its budget raises TemplateError with one line saying which. The
budget also records which message the template was reading (the item of a loop over
the messages, a slice of them, or messages[i]), so that a template that raises can
be told where, in one render.
"""
from __future__ import annotations

import re
import threading
import time

from jinja2 import Environment, nodes
from jinja2.nodes import EvalContext
from jinja2.runtime import Context, LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment


class TemplateError(ValueError):
    """A chat template that raised, looped, or exploded."""


# a width or precision in a %- or {}-format of more than 6 digits: a megabyte of padding
_WIDE_FORMAT = re.compile(r"%[-+ #0]*\d{7,}|%[-+ #0]*\d*\.\d{7,}|\{[^{}]*:[^{}]*\d{7,}[^{}]*\}")
_STAR_FORMAT = re.compile(r"%[-+ #0]*\*")
_WIDTH_ARGUMENTS = {"ljust": 0, "rjust": 0, "center": 0, "zfill": 0, "expandtabs": 0}
_WIDTH_FILTERS = {"center": 1, "indent": 1, "wordwrap": 1, "truncate": 1}
# filters that write a nested value out as text: its size is estimated first
_TEXT_FILTERS = {"tojson", "string", "pprint", "join", "urlencode", "xmlattr", "e", "escape",
                 "forceescape", "safe", "list"}
_current = threading.local()  # the budget of the render on this thread


class Budget:
    """What one render may still spend; the environment's hooks charge it."""

    def __init__(self, messages: list, max_items: int, max_chars: int, seconds: float):
        self.items_left, self.max_items, self.max_chars = max_items, max_items, max_chars
        self.seconds, self.deadline = seconds, time.monotonic() + seconds
        self.message_index = {id(m): i for i, m in enumerate(messages)}
        self.reading: int | None = None  # the message the template is on

    def __enter__(self):
        _current.budget = self
        return self

    def __exit__(self, *exc):
        _current.budget = None

    def range(self, *args) -> range:
        """range(), its items charged."""
        r = range(*args)
        self.tick(len(r))
        return r

    def tick(self, items: int = 1) -> None:
        self.items_left -= items
        if self.items_left < 0:
            raise TemplateError(f"the chat template asked for more than {self.max_items:,} "
                                f"loop items; cut off")
        if time.monotonic() > self.deadline:
            raise TemplateError(f"the chat template ran for more than {self.seconds:g} s; "
                                f"cut off")

    def size(self, n: int, what: str = "a value") -> None:
        if n > self.max_chars:
            raise TemplateError(f"the chat template builds {what} of {n:,} items; at most "
                                f"{self.max_chars:,}; cut off")

    def iterate(self, iterable):
        """iterable's items, each charged; a message among them is the one being read."""
        is_messages = False
        for item in iterable:
            self.tick()
            index = self.message_index.get(id(item))
            if index is not None:
                self.reading, is_messages = index, True
            yield item
        if is_messages:  # the loop over the messages ended: no message is at fault
            self.reading = None


def current() -> Budget:
    budget = getattr(_current, "budget", None)
    if budget is None:
        raise TemplateError("a chat template rendered outside its budget")
    return budget


def estimated_chars(value, limit: int) -> int:
    """About how long str(value) or its JSON would be, counted until past limit
    (a list of a list of a list multiplies without building anything)."""
    total, stack = 0, [value]
    while stack and total <= limit:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item) + 2
        elif isinstance(item, dict):
            total += 2 * len(item) + 2
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            total += len(item) + 2
            stack.extend(item)
        else:
            total += 8
    return total


def _length(value) -> int | None:
    return len(value) if isinstance(value, (str, list, tuple, dict)) else None


def _checked(value):
    """value, if not longer than the budget allows."""
    n = _length(value)
    if n is not None:
        current().size(n)
    return value


def _wide_format(text: str) -> None:
    if _WIDE_FORMAT.search(text) or _STAR_FORMAT.search(text):
        raise TemplateError("the chat template formats with a width of a megabyte or more "
                            "(or a computed one); cut off")


def check_str_method(budget: Budget, text: str, method: str, args) -> None:
    """Refuse a str method call whose result would be over the budget, before it runs."""
    if method in _WIDTH_ARGUMENTS and args and isinstance(args[0], int):
        width = args[0] * (text.count("\t") + 1 if method == "expandtabs" else 1)
        budget.size(width + len(text), "a string")
    elif method == "replace" and len(args) >= 2 and isinstance(args[0], str) \
            and isinstance(args[1], str):
        count = len(text) + 1 if args[0] == "" else text.count(args[0])
        budget.size(len(text) + count * len(args[1]), "a string")
    elif method == "join" and args:
        parts = args[0]
        budget.size(estimated_chars(parts, budget.max_chars)
                    + len(text) * (_length(parts) or 0), "a string")
    elif method in ("format", "format_map"):
        _wide_format(text)
        budget.size(len(text) + estimated_chars(list(args), budget.max_chars), "a string")


def bounded_filter(name: str, function):
    """function (a Jinja filter), refusing a result over the budget: checked before it
    runs where its input or a width says how big it gets, and after."""
    width_at = _WIDTH_FILTERS.get(name)

    def bounded(*args, **kwargs):
        budget = current()
        budget.tick(0)
        values = [a for a in args if not isinstance(a, (Context, EvalContext, Environment))]
        if values and name in _TEXT_FILTERS:
            budget.size(estimated_chars(values[0], budget.max_chars), "a string")
        if width_at is not None and len(values) > width_at and isinstance(values[width_at], int):
            budget.size(values[width_at] * (1 if name != "indent" else
                                            str(values[0]).count("\n") + 1), "a string")
        if name == "replace" and len(values) >= 3 and isinstance(values[0], str):
            check_str_method(budget, values[0], "replace", values[1:3])
        if name == "format" and values and isinstance(values[0], str):
            _wide_format(values[0])
        return _checked(function(*args, **kwargs))
    if hasattr(function, "jinja_pass_arg"):  # how Jinja knows to pass the context
        bounded.jinja_pass_arg = function.jinja_pass_arg
    return bounded


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, with every hook above charging the render's Budget."""
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, **options):
        super().__init__(**options)
        self.globals.pop("lipsum", None)
        self.filters = {name: bounded_filter(name, f) for name, f in self.filters.items()}
        self.finalize = self._output

    def add_filter(self, name: str, function) -> None:
        self.filters[name] = bounded_filter(name, function)

    # -- the template's source: each loop's items counted, each `~` checked -----------
    def _parse(self, source, name, filename):
        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(nodes.For):
            loop.iter = nodes.Call(nodes.EnvironmentAttribute("counted"), [loop.iter], [],
                                   None, None, lineno=loop.lineno)
        for concat in list(tree.find_all(nodes.Concat)):
            concat.nodes = [nodes.Call(nodes.EnvironmentAttribute("concat"), concat.nodes, [],
                                       None, None, lineno=concat.lineno)]
        return tree

    @staticmethod
    def counted(iterable):
        return current().iterate(iterable)

    @staticmethod
    def concat(*parts) -> str:
        budget = current()
        budget.size(sum(len(p) if isinstance(p, str) else estimated_chars(p, budget.max_chars)
                        for p in parts), "a string")
        return "".join(map(str, parts))

    # -- operators, calls, output, items -----------------------------------------------
    def call_binop(self, context, operator, left, right):
        budget = current()
        budget.tick(0)
        if operator == "**" and isinstance(left, int) and isinstance(right, int):
            if right > 64 or left.bit_length() * max(right, 0) > 4 * budget.max_chars:
                raise TemplateError(f"the chat template raises a number to the power {right}; "
                                    f"cut off")
        elif operator == "*":
            for seq, n in ((left, right), (right, left)):
                if _length(seq) is not None and isinstance(n, int):
                    budget.size(len(seq) * n)
        elif operator == "+" and _length(left) is not None and _length(right) is not None:
            budget.size(len(left) + len(right))
        elif operator == "%" and isinstance(left, str):
            _wide_format(left)
            budget.size(len(left) + estimated_chars(right, budget.max_chars), "a string")
        return _checked(super().call_binop(context, operator, left, right))

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (Jinja's signature)
        budget = current()
        budget.tick(0)
        if isinstance(__obj, LoopContext) and args:  # a recursive loop's next level
            args = (budget.iterate(args[0]), *args[1:])
        method = getattr(__obj, "__wrapped__", __obj)  # (str.format comes wrapped)
        if isinstance(getattr(method, "__self__", None), str):
            check_str_method(budget, method.__self__, getattr(method, "__name__", ""), args)
        return _checked(super().call(__context, __obj, *args, **kwargs))

    @staticmethod
    def _output(value):
        budget = current()
        budget.tick(0)
        if not isinstance(value, str):
            budget.size(estimated_chars(value, budget.max_chars), "an output")
        return value

    def getitem(self, obj, argument):
        value = super().getitem(obj, argument)
        budget = current()
        index = budget.message_index.get(id(value))
        if index is not None:
            budget.reading = index
        return value
