"""The peer programs of ``adpipe bench --peers``: standalone scripts, each
run by the bench driver (``adpipe.tools.bench_peers``) as a subprocess in
its own environment (``.cache/bench/<peer>``), so none imports adpipe or
pyspark. ``peer_common`` is what they share (stdlib only); each script ends
by printing one ``BENCH-REPORT {json}`` line the driver reads back."""
