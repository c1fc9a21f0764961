# bench: Serval with per-request timing off, for the instrumentation workload.
timing false
