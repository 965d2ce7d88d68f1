"""The peer programs of ``make bench``: standalone scripts, each run by the
bench driver (``bench.engines.launch``) by its path, as a subprocess in its
own environment (``.cache/bench/<peer>``), so none imports adpipe or
pyspark. ``peer_common`` is what they share (stdlib only); each script ends
by printing one ``BENCH-REPORT {json}`` line the driver reads back."""
