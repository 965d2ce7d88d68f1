"""The local broker's pure parts."""

from __future__ import annotations

import base64
from pathlib import Path

from adpipe.local.kafka_broker import _cluster_id, nodes, server_properties
from adpipe.settings import load_settings


def test_a_cluster_id_never_starts_like_an_option() -> None:
    ids = [_cluster_id() for _ in range(2000)]  # without the rule, about 31 would start with "-"
    assert not [i for i in ids if i.startswith("-")]
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids)
    assert len(set(ids)) == len(ids)


def test_a_cluster_of_several_nodes_fences_a_dead_one_within_seconds_a_single_node_keeps_the_defaults(
    tmp_path: Path,
) -> None:
    settings = load_settings({"ADPIPE_HOME": str(tmp_path)})
    cluster = nodes(settings, 3)
    three = server_properties(settings, cluster[1], cluster).splitlines()
    assert "broker.session.timeout.ms=4000" in three and "broker.heartbeat.interval.ms=1000" in three
    one = server_properties(settings).splitlines()
    assert not [line for line in one if line.startswith(("broker.session.timeout.ms", "broker.heartbeat"))]
