"""The local broker's pure parts."""

from __future__ import annotations

import base64

from adpipe.local.kafka_broker import _cluster_id


def test_a_cluster_id_never_starts_like_an_option() -> None:
    ids = [_cluster_id() for _ in range(2000)]  # without the rule, about 31 would start with "-"
    assert not [i for i in ids if i.startswith("-")]
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids)
    assert len(set(ids)) == len(ids)
