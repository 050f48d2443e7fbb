"""Model worker processes: typed messages, the shared-memory tensor channel, the blocking
worker loop (``process``) and its event-loop side (``pool``)."""
