from collections import deque

from sluice.scheduling.policy import BatchPolicy, Job, take_batch


def job(bs=1, shape=((4,),), t=0, level=0):
    return Job(request=None, future=None, batch_size=bs, shape_key=shape, enqueue_ns=t, level=level)


def q(*jobs):
    return [deque(jobs)]


def test_no_dynamic_batching_takes_one():
    p = BatchPolicy(dynamic=False, max_batch_size=8)
    assert take_batch(q(job(), job()), p, 0) == (1, 0)


def test_empty_queue():
    p = BatchPolicy(dynamic=True, max_batch_size=8)
    assert take_batch([deque()], p, 0) == (0, 0)


def test_full_batch_runs_at_once():
    p = BatchPolicy(dynamic=True, max_batch_size=4, max_delay_ns=10**9)
    assert take_batch(q(*(job() for _ in range(6))), p, 0) == (4, 0)


def test_waits_for_delay_then_runs_partial():
    p = BatchPolicy(dynamic=True, max_batch_size=8, max_delay_ns=1000)
    queues = q(job(t=100), job(t=200))
    assert take_batch(queues, p, 500) == (0, 1100)
    assert take_batch(queues, p, 1100) == (2, 0)


def test_preferred_size_runs_at_once():
    p = BatchPolicy(dynamic=True, max_batch_size=8, preferred=frozenset({4, 8}), max_delay_ns=10**9)
    assert take_batch(q(*(job() for _ in range(5))), p, 0) == (4, 0)
    assert take_batch(q(*(job() for _ in range(3))), p, 0)[0] == 0


def test_shape_mismatch_closes_batch():
    p = BatchPolicy(dynamic=True, max_batch_size=8, max_delay_ns=10**9)
    assert take_batch(q(job(), job(), job(shape=((5,),))), p, 0) == (2, 0)


def test_requests_with_batch_gt_1_count_items():
    p = BatchPolicy(dynamic=True, max_batch_size=8, max_delay_ns=10**9)
    assert take_batch(q(job(bs=3), job(bs=3), job(bs=3)), p, 0) == (2, 0)


def test_priority_levels_in_order():
    p = BatchPolicy(dynamic=True, max_batch_size=2, max_delay_ns=0)
    high, low = deque([job(level=0)]), deque([job(level=1), job(level=1)])
    assert take_batch([high, low], p, 0) == (2, 0)
    assert take_batch([deque(), low], p, 0) == (2, 0)
