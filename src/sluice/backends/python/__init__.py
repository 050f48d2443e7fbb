"""Triton's python backend: every model instance runs in a worker process of its own.

- ``server``: the backend and its instances as the core sees them (registered as "python").
- ``pool``: a worker process driven from the event loop (start, call, restart, stop), and
  the requests a worker sends back (BLS calls, decoupled responses).
- ``worker``: the blocking loop inside the worker process that runs ``model.py``.
- ``forkserver`` / ``zygote``: workers forked from one process that imported numpy and the
  worker runtime once (the server's side / that process's own).
- ``messages``: the typed protocol between the two; ``shm``: the shared-memory tensor arenas.
- ``pb_utils``: the ``triton_python_backend_utils`` module that models import.

This file imports nothing: the worker process imports this package before it has set the
thread-count variables that numpy's BLAS reads at import.
"""
