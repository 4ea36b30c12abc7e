"""Reading YAML (and JSON) from users with bounded time and memory.

PyYAML's ``safe_load`` never runs code, but it trusts the size of what it reads: a 40 MB file of a million
keys takes minutes, a 20,000-level nesting ends in RecursionError, and a 1 KB "billion laughs" file of
aliases to aliases expands to 10^9 nodes as soon as anything walks it. ``load_yaml`` refuses, in one line,
a file past each stated limit before the mapping is built:

- ``MAX_INPUT_BYTES``: 8 MiB, 10x the largest YAML the project ships (benchmarks/data/.../gpt.yaml, 0.76 MB);
- ``MAX_DEPTH``: 64 levels of nesting (the deepest echo-tune file, a search space, has 4);
- ``MAX_NODES``: 1,000,000 nodes *after* alias expansion (an alias counts the nodes it stands for);
- ``MAX_NUMBER_CHARS``: 100 characters in one number (Python refuses to read an integer of more than 4,300
  digits with a traceback, and no quantity echo-tune reads needs more than 20 digits).

The limits are checked on the parser's event stream (no recursion, linear time); libyaml's C parser is
used when PyYAML has it.
"""

from __future__ import annotations

import json

import yaml

from echo_tune.errors import ConfigError

MAX_INPUT_BYTES = 8 * 2**20
MAX_DEPTH = 64
MAX_NODES = 1_000_000
MAX_NUMBER_CHARS = 100

_RESOLVER = yaml.resolver.Resolver()
_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def check_size(text: str, what: str) -> None:
    """Refuse a text larger than ``MAX_INPUT_BYTES`` (its UTF-8 length)."""
    size = len(text) if len(text) > MAX_INPUT_BYTES else len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_INPUT_BYTES:
        raise ConfigError(f"{what} is {size / 2**20:.1f} MiB; `size <= {MAX_INPUT_BYTES // 2**20} MiB` must hold "
                          f"for an input file (10x the largest file echo-tune ships); give a smaller file")


def _depth_error(what: str) -> ConfigError:
    return ConfigError(f"{what} nests deeper than {MAX_DEPTH} levels; `depth <= {MAX_DEPTH}` must hold "
                       f"(echo-tune files nest 4 levels at most); flatten the file")


def _check_events(text: str, what: str) -> None:
    """Depth and expanded node count from the event stream (aliases count the nodes they stand for). libyaml
    (PyYAML >= 6.0.4's C parser) may stop a deep file itself while scanning ahead: the same rule, said the same way."""
    try:
        _walk_events(text, what)
    except yaml.YAMLError as exc:
        if "nesting depth" in str(exc):
            raise _depth_error(what) from None
        raise


def _walk_events(text: str, what: str) -> None:
    stack: list[list] = []  # per open collection: [anchor, expanded node count]
    anchors: dict[str, int] = {}
    total = 0
    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            if len(stack) >= MAX_DEPTH:
                raise _depth_error(what)
            stack.append([event.anchor, 1])
            continue
        if isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            anchor, count = stack.pop()
        elif isinstance(event, yaml.ScalarEvent):
            anchor, count = event.anchor, 1
            if len(event.value) > MAX_NUMBER_CHARS and event.implicit[0] and not event.style and \
                    _RESOLVER.resolve(yaml.ScalarNode, event.value, (True, False)) in _NUMBER_TAGS:
                _too_long(what, event.value)
        elif isinstance(event, yaml.AliasEvent):
            anchor, count = None, anchors.get(event.anchor, 1)
        else:
            continue
        if anchor is not None:
            anchors[anchor] = count
        if stack:
            stack[-1][1] += count
        else:
            total += count
        if total + sum(c for _, c in stack) > MAX_NODES:
            raise ConfigError(f"{what} holds more than {MAX_NODES:,} values once its aliases (*name) are expanded; "
                              f"`values <= {MAX_NODES:,}` must hold; write the values out or use fewer aliases")


def _too_long(what: str, number: str) -> None:
    raise ConfigError(f"{what} holds a number of {len(number):,} characters ({number[:20]}...); `characters of a number "
                      f"<= {MAX_NUMBER_CHARS}` must hold (no quantity echo-tune reads needs more than 20 digits); "
                      f"write the number out in fewer digits")


def load_yaml(text: str, what: str):
    """``yaml.safe_load`` of ``text`` within the limits above; a YAMLError is left to the caller."""
    check_size(text, what)
    _check_events(text, what)
    return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader (CSafeLoader or SafeLoader)


def load_json(text: str, what: str):
    """``json.loads`` of ``text`` within ``MAX_INPUT_BYTES`` and ``MAX_DEPTH``; ValueError is left to the caller."""
    check_size(text, what)
    depth = deepest = run = 0
    in_string = escaped = False
    for at, ch in enumerate(text):  # brackets outside strings: the nesting depth, before json recurses into it
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                raise ConfigError(f"{what} nests deeper than {MAX_DEPTH} levels; `depth <= {MAX_DEPTH}` must hold; "
                                  f"flatten the file")
        elif ch in "]}":
            depth -= 1
        if not in_string and (ch.isdigit() or (run and ch in "+-.eE")):  # a number's characters, outside strings
            run += 1
            if run > MAX_NUMBER_CHARS:
                end = at + 1
                while end < len(text) and (text[end].isdigit() or text[end] in "+-.eE"):
                    end += 1
                _too_long(what, text[at + 1 - run:end])
        else:
            run = 0
    return json.loads(text)
