"""The wire parser's whole-list fast path for numbers accepts and refuses exactly what the item-by-item
rules do, and names the first bad item when it refuses."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from controlplane.core.wire import bounded, parse_dataclass


@dataclass(frozen=True)
class Body:
    tokens: list[int] = field(metadata=bounded(0, 1000, max_len=100))
    logprobs: list[float] = field(default_factory=list, metadata=bounded(max_len=100))


def parse(data: dict) -> Body:
    return parse_dataclass(Body, data, "body", error=ValueError, int_min=0)


def test_well_formed_lists_pass_unchanged_and_ints_become_floats_where_floats_are_asked():
    b = parse({"tokens": [0, 5, 1000], "logprobs": [-0.5, 0, -3]})
    assert b.tokens == [0, 5, 1000] and b.logprobs == [-0.5, 0.0, -3.0]
    assert all(type(x) is float for x in b.logprobs)
    assert parse({"tokens": []}).tokens == []


@pytest.mark.parametrize(
    "data,message",
    [
        ({"tokens": [1, 2, -1]}, r"body.tokens\[2\]: must be >= 0"),
        ({"tokens": [1, 1001]}, r"body.tokens\[1\]: must be <= 1000"),
        ({"tokens": [1, True]}, r"body.tokens\[1\]: must be an integer"),
        ({"tokens": [1, 2.0]}, r"body.tokens\[1\]: must be an integer"),
        ({"tokens": [1, "2"]}, r"body.tokens\[1\]: must be an integer"),
        ({"tokens": [1], "logprobs": [0.1, float("nan")]}, r"body.logprobs\[1\]: must be finite"),
        ({"tokens": [1], "logprobs": [0.1, 10**400]}, r"body.logprobs\[1\]: must be finite"),
        ({"tokens": [1], "logprobs": [False]}, r"body.logprobs\[0\]: must be a number"),
        ({"tokens": list(range(101))}, r"body.tokens: at most 100 items"),
    ],
)
def test_a_bad_item_is_refused_with_its_index(data, message):
    with pytest.raises(ValueError, match=message):
        parse(data)


def test_to_json_is_asdict_without_copying_scalar_lists():
    from dataclasses import asdict

    from controlplane.core.wire import to_json

    @dataclass(frozen=True)
    class Outer:
        bodies: list[Body]
        meta: dict
        pair: tuple[int, int] = (1, 2)

    tokens = [1, 2, 3]
    o = Outer([Body(tokens, [0.5]), Body([4], [])], {"a": [Body([7])], "b": 1})
    out = to_json(o)
    assert out == {**asdict(o), "pair": [1, 2], "meta": {"a": [{"tokens": [7], "logprobs": []}], "b": 1}}
    assert out["bodies"][0]["tokens"] is tokens  # not copied item by item
