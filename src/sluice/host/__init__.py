"""The host machine: the garbage collector's settings, system memory, and a precise deadline
timer (shared by the batcher and the load tester)."""
