from collections import deque

from sluice.scheduling.policy import BatchPolicy, Job, take_batch


def job(bs=1, shape=((4,),), t=0, level=0, arrival=0):
    return Job(
        request=None,
        future=None,
        batch_size=bs,
        shape_key=shape,
        enqueue_ns=t,
        level=level,
        arrival_ns=arrival,
    )


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


def test_a_lone_request_waits_from_its_arrival_in_the_server():
    # received by the front-end at 40, queued at 100: the front-end's 60 ns count against
    # the 1000 ns window, so the batch is due at 1040, not 1100
    p = BatchPolicy(dynamic=True, max_batch_size=8, max_delay_ns=1000)
    queues = q(job(t=100, arrival=40))
    assert take_batch(queues, p, 500) == (0, 1040)
    assert take_batch(queues, p, 1040) == (1, 0)


def test_a_forming_batch_waits_from_the_oldest_enqueue_as_triton():
    # once a second request has joined, the window is Triton's again (from the head's
    # enqueue), so batches under load are not cut short by front-end time
    p = BatchPolicy(dynamic=True, max_batch_size=8, max_delay_ns=1000)
    queues = q(job(t=100, arrival=40), job(t=300, arrival=250))
    assert take_batch(queues, p, 1040) == (0, 1100)
    assert take_batch(queues, p, 1100) == (2, 0)


def test_a_request_without_an_arrival_waits_from_its_enqueue():
    p = BatchPolicy(dynamic=True, max_batch_size=8, max_delay_ns=1000)
    assert take_batch(q(job(t=100)), p, 500) == (0, 1100)


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
