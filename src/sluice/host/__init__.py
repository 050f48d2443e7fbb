"""The host machine: the garbage collector's settings and system memory."""
