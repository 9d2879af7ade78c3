"""The one wire codec of PEARL's three protocols: the agent link (`core/agent_link`), the driver link
(`core/driver_link`) and the data plane (`agents/dataplane`).

Each protocol is a `WireProtocol` value (its framing: limits, whether messages carry a `type`, how it spells
the one error message `ErrorReply`); `WireProtocol.dump` turns a message dataclass into JSON-ready dicts and
`WireProtocol.parse` builds one back, by its `type` from a table of message classes or as one expected class.
A message crosses a trust boundary, so parsing is strict: unknown fields, missing fields, wrong
types, non-finite numbers, out-of-range values and oversized strings or lists raise `WireError`
with a message naming the field (`heartbeat.workers[0].role: unknown value 'boss'`).
Bounds live on the dataclass fields: `field(metadata=bounded(lo=0, max_len=64))`.
The message classes live with their protocol; the bytes each protocol writes are pinned by recorded
frames (tests/unit/core/wire_frames.json).
"""

from __future__ import annotations

import enum
import functools
import json
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import Any, ClassVar

import orjson

DEFAULT_MAX_STR = 4096
DEFAULT_MAX_LIST = 4096
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")  # NUL and lone surrogates: no database stores them


DEFAULT_MAX_INT = 2**63 - 1  # what a database BIGINT holds


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (numbers must be finite)")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]} is out of range (numbers must be finite)")
    return value


def loads(raw: str | bytes, *, max_depth: int, error: type[Exception] = ValueError, storable: bool = False) -> Any:
    """Decode one JSON document strictly: no NaN/Infinity, at most `max_depth` levels of nesting
    (checked without recursion, and a decoder RecursionError is a refusal, not a crash), and with
    `storable`, no string (key or value) holding NUL or a lone surrogate."""
    try:
        data = json.loads(raw, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise error(f"JSON nested deeper than {max_depth} levels") from None
    except UnicodeDecodeError as exc:
        raise error(f"body is not UTF-8: {exc}") from None
    except ValueError as exc:  # JSONDecodeError and the constants above
        raise error(f"malformed JSON: {exc}") from None
    stack: list[tuple[Any, int, str]] = [(data, 1, "$")]
    while stack:
        value, depth, where = stack.pop()
        if isinstance(value, dict):
            if depth > max_depth:
                raise error(f"JSON nested deeper than {max_depth} levels")
            for k, v in value.items():
                if storable and _UNSTORABLE.search(k):
                    raise error(f"{where}: a key holds a NUL or lone surrogate character")
                stack.append((v, depth + 1, f"{where}.{k[:40]}"))
        elif isinstance(value, list):
            if depth > max_depth:
                raise error(f"JSON nested deeper than {max_depth} levels")
            stack.extend((v, depth + 1, f"{where}[{i}]") for i, v in enumerate(value))
        elif storable and isinstance(value, str) and _UNSTORABLE.search(value):
            raise error(f"{where}: strings may not hold NUL or lone surrogate characters")
    return data


def bounded(lo: float | None = None, hi: float | None = None, max_len: int | None = None) -> dict[str, Any]:
    """Field metadata: numeric range [lo, hi] (also for list items) and max length of a str/list."""
    return {"lo": lo, "hi": hi, "max_len": max_len}


def parse_dataclass(
    cls: type,
    data: Any,
    where: str,
    *,
    error: type[ValueError] = ValueError,
    int_min: int | None = None,
    check: Callable[[Any, str], None] | None = None,
) -> Any:
    """Build `cls` from decoded JSON, recursively; `int_min` is the default lower bound of integer
    fields without their own; `check(obj, where)` runs on every dataclass built (cross-field rules)."""
    if not isinstance(data, dict):
        raise error(f"{where}: must be a JSON object")
    hints = _hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise error(f"{where}: unknown fields {sorted(unknown)}")
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in data:
            if f.default is MISSING and f.default_factory is MISSING:
                raise error(f"{where}: missing field {f.name!r}")
            continue
        kwargs[f.name] = _coerce(
            hints[f.name], data[f.name], f"{where}.{f.name}", dict(f.metadata), error, int_min, check
        )
    obj = cls(**kwargs)
    if check is not None:
        check(obj, where)
    return obj


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@functools.cache
def _is_json_typed(hint: Any) -> bool:
    """`Any`, `dict[str, Any]`, a list of those (or None besides): a field whose value is JSON already."""
    if hint is Any:
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return len(rest) == 1 and _is_json_typed(rest[0])
    if origin is dict:
        return args[1:] == (Any,)
    if origin is list:
        return len(args) == 1 and args[0] is not Any and _is_json_typed(args[0])
    return False


@functools.cache
def _field_names(cls: type) -> tuple[tuple[str, bool], ...]:
    """(name, JSON already) of a class's fields: a record, a checkpoint, a job's agent spec are sent as they
    are, not walked item by item (a driver's checkpoint is hundreds of KiB every 2 s)."""
    hints = _hints(cls)
    return tuple((f.name, _is_json_typed(hints[f.name])) for f in fields(cls))


def to_json(obj: Any) -> Any:
    """A message dataclass as JSON-ready dicts and lists: `dataclasses.asdict` without copying lists of
    scalars item by item (token ids, logprobs; the result is encoded at once, never mutated), nor walking
    fields typed as JSON already. A class's fields are looked up once (a rollout driver dumps a request per
    turn, thousands a second)."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return {
            name: getattr(obj, name) if as_is else to_json(getattr(obj, name))
            for name, as_is in _field_names(type(obj))
        }
    if isinstance(obj, (list, tuple)):
        # message lists are homogeneous (list[X]): the first item tells whether there is anything to convert
        if obj and (is_dataclass(obj[0]) or isinstance(obj[0], (list, tuple, dict))):
            return [to_json(v) for v in obj]
        return obj if isinstance(obj, list) else list(obj)
    if isinstance(obj, dict):
        return {k: to_json(v) for k, v in obj.items()}
    return obj


def _numbers(kind: type, value: list[Any], lo: Any, hi: Any, int_min: int | None) -> list[Any] | None:
    """A list of numbers checked in whole-list passes (the same rules as `_coerce` item by item), or
    None if some item breaks them. The passes run in C (`map`): a turn's token ids and log-probs are
    thousands of items, on every request and every answer."""
    if not value:
        return []
    kinds = set(map(type, value))
    if kind is int:
        if kinds != {int}:
            return None
        low = lo if lo is not None else int_min
        high = hi if hi is not None else DEFAULT_MAX_INT
    else:
        try:
            if not kinds <= {float, int} or not all(map(math.isfinite, value)):
                return None
        except OverflowError:  # an integer beyond any float
            return None
        low, high = lo, hi
    if (low is not None and min(value) < low) or (high is not None and max(value) > high):
        return None
    return list(value) if kind is int or kinds == {float} else list(map(float, value))


def _coerce(
    hint: Any,
    value: Any,
    where: str,
    meta: dict[str, Any],
    error: type[ValueError],
    int_min: int | None,
    check: Callable[[Any, str], None] | None,
) -> Any:
    lo, hi, max_len = meta.get("lo"), meta.get("hi"), meta.get("max_len")
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        inner = next(o for o in options if o is not type(None))
        return _coerce(inner, value, where, meta, error, int_min, check)
    if origin is list:
        if not isinstance(value, list):
            raise error(f"{where}: must be a list")
        limit = max_len if max_len is not None else DEFAULT_MAX_LIST
        if len(value) > limit:
            raise error(f"{where}: at most {limit} items")
        (item,) = typing.get_args(hint)
        if item is int or item is float:  # token ids and logprobs: tens of thousands per request
            numbers = _numbers(item, value, lo, hi, int_min)
            if numbers is not None:
                return numbers  # else the item-by-item pass below names the first bad item
        item_meta = {"lo": lo, "hi": hi}
        return [_coerce(item, v, f"{where}[{i}]", item_meta, error, int_min, check) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise error(f"{where}: must be an object")
        return value
    if hint is Any:
        return value
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(value)
        except ValueError:
            raise error(f"{where}: unknown value {value!r}") from None
    if hint is bool:
        if not isinstance(value, bool):
            raise error(f"{where}: must be a boolean")
        return value
    if hint in (int, float):
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or (hint is int and not isinstance(value, int))
        ):
            raise error(f"{where}: must be {'an integer' if hint is int else 'a number'}")
        if isinstance(value, float) and not math.isfinite(value):
            raise error(f"{where}: must be finite")
        low = lo if lo is not None else (int_min if hint is int else None)
        if low is not None and value < low:
            raise error(f"{where}: must be >= {low}")
        high = hi if hi is not None else (DEFAULT_MAX_INT if hint is int else None)
        if high is not None and value > high:
            raise error(f"{where}: must be <= {high}")
        try:
            return hint(value)
        except OverflowError:
            raise error(f"{where}: must be finite") from None
    if hint is str:
        if not isinstance(value, str):
            raise error(f"{where}: must be a string")
        if len(value) > (max_len or DEFAULT_MAX_STR):
            raise error(f"{where}: too long")
        return value
    if isinstance(hint, type) and is_dataclass(hint):
        return parse_dataclass(hint, value, where, error=error, int_min=int_min, check=check)
    raise error(f"{where}: unsupported field type")  # pragma: no cover - a protocol definition error


# ---------------------------------------------------------------- the codec
class WireError(ValueError):
    """A message that does not follow its protocol (agent link, driver link or data plane): the text names
    the field. A link answers it with an `ErrorReply` and stays up; the data plane answers HTTP 400."""


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """The one refusal of every protocol: `error` says what kind (a short code: `bad_message`,
    `stale_epoch`...), `detail` says why, `field` names the field at fault (if one is)."""

    type: ClassVar[str] = "error"
    error: str = field(default="", metadata=bounded(max_len=64))
    detail: str = field(default="", metadata=bounded(max_len=DEFAULT_MAX_STR))
    field: str = field(default="", metadata=bounded(max_len=256))  # last: the name shadows dataclasses.field


ERROR_KEYS = {"error": "error", "detail": "detail", "field": "field"}


@dataclass(frozen=True)
class WireProtocol:
    """One wire protocol's framing; `dump` and `parse` are the codec every protocol uses."""

    name: str
    tagged: bool = True  # every message carries its class's `type` (the links; the data plane's routes say it)
    type_last: bool = False  # `type` written after the fields (the agent link's frames always were)
    # how the protocol spells `ErrorReply`'s fields (field name -> JSON key; a field not named is not sent)
    error_keys: Mapping[str, str] = field(default_factory=lambda: ERROR_KEYS)
    max_bytes: int = 1 << 20  # of one JSON text (`decode`)
    # nesting checked item by item (`loads`); None: orjson's own bound (1,024 levels), for bodies of tens of
    # thousands of token ids a turn, where walking every item would cost milliseconds
    max_depth: int | None = 64
    storable: bool = False  # refuse strings no database stores (NUL, lone surrogates)
    int_min: int | None = None  # the lower bound of integer fields without their own
    check: Callable[[Any, str], None] | None = None  # cross-field rules, run on every dataclass built

    def dump(self, message: Any) -> dict[str, Any]:
        """A message dataclass -> JSON-ready dict (with its `type` where the protocol is tagged)."""
        if isinstance(message, ErrorReply):
            body = {key: getattr(message, name) for name, key in self.error_keys.items()}
        else:
            body = to_json(message)
        if not self.tagged:
            return body
        kind = message.type
        return {**body, "type": kind} if self.type_last else {"type": kind, **body}

    def decode(self, raw: str | bytes) -> Any:
        """One JSON text -> JSON value, strictly (`loads` within the protocol's limits); WireError otherwise."""
        if len(raw) > self.max_bytes:
            raise WireError(f"messages are JSON text of at most {self.max_bytes} bytes")
        if self.max_depth is None and not self.storable:
            try:
                return orjson.loads(raw)  # strict already: no NaN or Infinity, UTF-8 without lone surrogates
            except orjson.JSONDecodeError as exc:
                raise WireError(f"malformed JSON: {exc}") from None
        return loads(raw, max_depth=self.max_depth or 1024, error=WireError, storable=self.storable)

    def parse(self, data: Any, expected: type | Mapping[str, type], where: str | None = None) -> Any:
        """Decoded JSON -> the message: of class `expected`, or (a table of classes by `type`) of the class
        its `type` names. WireError, naming the field, for anything the protocol does not allow."""
        at: str
        if isinstance(expected, type):
            cls, body, at = expected, data, where or expected.__name__
        else:
            if not isinstance(data, dict):
                raise WireError(f"{where or self.name}: a message must be a JSON object")
            kind = data.get("type")
            found = expected.get(kind) if isinstance(kind, str) else None
            if found is None:
                side, known = where or self.name, sorted(expected)
                raise WireError(f"{side}.type: unknown message type {str(kind)[:64]!r}; expected one of {known}")
            cls, body, at = found, {k: v for k, v in data.items() if k != "type"}, where or str(kind)
        if cls is ErrorReply and isinstance(body, dict):
            names = {key: name for name, key in self.error_keys.items()}
            body = {names.get(k, f"({k})"): v for k, v in body.items()}
        return parse_dataclass(cls, body, at, error=WireError, int_min=self.int_min, check=self.check)
