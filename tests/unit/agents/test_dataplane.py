import pytest

from agents import dataplane as dp
from controlplane.core.wire import WireError


def test_parse_accepts_a_full_request():
    req = dp.DATA_PLANE.parse(
        {
            "request_id": "r1",
            "prompt": "hi",
            "sampling": {"max_tokens": 4, "temperature": 0.7, "top_p": 0.9, "seed": 3},
        },
        dp.GenerateRequest,
    )
    assert req.sampling.max_tokens == 4 and req.sampling.temperature == 0.7


@pytest.mark.parametrize(
    "body, needle",
    [
        ({"prompt": "hi"}, "request_id"),
        ({"request_id": "r", "prompt": "hi", "x": 1}, "unknown fields"),
        ({"request_id": "r", "prompt_tokens": "abc"}, "must be a list"),
        ({"request_id": "r", "prompt_tokens": [1, -2]}, ">= 0"),
        ({"request_id": "r", "prompt_tokens": [1], "sampling": {"max_tokens": 0}}, "max_tokens"),
        ({"request_id": "r", "prompt_tokens": [1], "sampling": {"temperature": True}}, "temperature"),
        ({"request_id": "r", "prompt_tokens": [1], "sampling": {"top_p": 2}}, "top_p"),
        ({"request_id": "r", "prompt": "a", "prompt_tokens": [1]}, "not both"),
        ({"request_id": "r" * 500, "prompt": "a"}, "too long"),
        ({"request_id": "r", "prompt_tokens": [1] * (dp.MAX_PROMPT_TOKENS + 1)}, "at most"),
    ],
)
def test_parse_rejects_bad_generate_requests(body, needle):
    with pytest.raises(WireError, match=needle):
        dp.DATA_PLANE.parse(body, dp.GenerateRequest)


def test_parse_rejects_bad_control_requests():
    with pytest.raises(WireError, match="role"):
        dp.DATA_PLANE.parse({"role": "janitor"}, dp.SetRoleRequest)
    with pytest.raises(WireError, match="mode"):
        dp.DATA_PLANE.parse({"mode": "later"}, dp.DrainRequest)
    with pytest.raises(WireError, match="http"):
        dp.DATA_PLANE.parse({"request_id": "r", "kv_url": "file:///etc/passwd", "handle": "h"}, dp.DecodeRequest)
    with pytest.raises(WireError, match="JSON object"):
        dp.DATA_PLANE.parse(["r"], dp.AbortRequest)
