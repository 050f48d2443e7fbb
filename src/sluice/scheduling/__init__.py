"""Request scheduling: queues, priorities, timeouts and the dynamic batcher."""
