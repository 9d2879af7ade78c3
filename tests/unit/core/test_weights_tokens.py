"""The nodes' weights-token resends (core.agent_link.resend_bucket): spread over a period, never stale."""

from __future__ import annotations

import numpy as np

from controlplane.core import agent_link as link

KEY = "ab" * 32


def test_resends_of_a_thousand_nodes_are_spread_over_half_a_period() -> None:
    rotate, nodes = 300.0, range(1, 1025)
    t = np.arange(0.0, 2 * rotate, 1.0)  # one sample a second over two periods
    when = [t[1:][np.diff([link.resend_bucket(rotate, n, float(x)) for x in t]) != 0] for n in nodes]
    assert all(len(w) == 2 for w in when)  # once a period, each node
    first = np.array([w[0] for w in when]) % rotate
    assert first.max() - first.min() >= 0.45 * rotate and first.max() < 0.5 * rotate + 1
    # no heartbeat period (3 s) holds more than 3 % of the nodes' resends (uniform: 2 %; all of them before)
    counts = np.histogram(first, bins=np.arange(0.0, rotate + 3, 3.0))[0]
    assert counts.max() <= 0.03 * len(nodes)


def test_the_token_a_node_holds_is_valid_until_well_after_its_next_resend() -> None:
    rotate = 10.0
    for node in (1, 2, 7, 513, 1024):
        for sent in np.arange(0.0, 3 * rotate, 0.25):
            token = link.weights_token(KEY, "job", link.token_bucket(rotate, float(sent)))
            b = link.resend_bucket(rotate, node, float(sent))
            nxt = next(x for x in np.arange(sent, sent + 2 * rotate, 0.05) if link.resend_bucket(rotate, node, x) != b)
            # a heartbeat up to half a period after the resend is due still finds the old token good
            for now in np.arange(sent, nxt + 0.45 * rotate, 0.25):
                assert link.verify_weights_token(KEY, "job", token, rotate, now=float(now)), (node, sent, now)
