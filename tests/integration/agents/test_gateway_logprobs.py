"""Log-probs through the gateway, with the official `openai` SDK: each sampled token's log-prob is the
engine's own; top-k alternatives, which PEARL's engines do not return, are a clear 400 naming the
parameter, never the sampled token echoed back as its only "alternative"."""

from __future__ import annotations

import openai
import pytest

from agents.tokenizer import TOKENIZER
from tests.integration.agents.test_gateway import USER, direct, extra, extra_body, gateway, http, worker  # noqa: F401  (fixtures)


async def test_sampled_token_logprobs_are_the_engines_and_no_alternatives_are_made_up(gateway, worker, http):  # noqa: F811
    s = gateway.open("t-lp")
    c = openai.AsyncOpenAI(base_url=f"{gateway.base_url}/v1", api_key=s.key, max_retries=0)
    out = await c.chat.completions.create(
        model="tiny", messages=USER, max_tokens=6, seed=5, logprobs=True, extra_body={"return_token_ids": True}
    )
    ch = out.choices[0]
    eng = await direct(http, worker, extra(out)["prompt_token_ids"], 6, 5)
    assert ch.logprobs is not None and ch.logprobs.content is not None
    assert [e.logprob for e in ch.logprobs.content] == pytest.approx(eng["logprobs"])
    assert all(e.top_logprobs == [] for e in ch.logprobs.content)
    turns = s.tokens.current.turns
    for ask in (
        lambda: c.chat.completions.create(model="tiny", messages=USER, max_tokens=2, logprobs=True, top_logprobs=3),
        lambda: c.completions.create(model="tiny", prompt=TOKENIZER.encode("1+1="), max_tokens=2, logprobs=2),
    ):
        with pytest.raises(openai.BadRequestError) as err:
            await ask()
        body = extra_body(err.value)
        assert body["code"] == "unsupported_parameter"
        assert body["param"] in ("top_logprobs", "logprobs") and "alternatives" in body["message"]
    assert s.tokens.current.turns == turns  # a refused request samples nothing
    await c.close()
