"""What every service process runs on: typed settings and their flags, logs, tracing, metrics,
the request id and per-request timing, heap trimming, the CPU quota, lifecycle, draining and
restart counts."""
