# bench: Serval with per-request timing on (the default), for the instrumentation workload.
timing true
