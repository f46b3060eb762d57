"""A grant does not make the GPU's sample unfresh (docs/architecture.md §2): the next request
is admitted on the same sample, with the grant booked in full; a sample that began before a
grant never shows the new lease using anything; observed use discounts only memory the
sample's device_used holds.

An in-process broker with a manual clock: no sample is taken unless the test takes one.
"""

from __future__ import annotations

from rbroker.broker.capacity import Capacity
from rbroker.broker.leases import Lease
from rbroker.gpu.scenario import SimProcess
from rbroker_protocol.errors import RpcError
from tests.conftest import GPU0
from tests.desktop.inprocess import InProcessBroker, SleeperPool

TOTAL, HEADROOM = 24576, 1229  # SINGLE_24G with the default headroom


def _cap(h: InProcessBroker) -> Capacity:
    cap = h.broker.capacity(GPU0)
    assert cap is not None
    return cap


def test_grants_follow_each_other_on_one_sample_each_booked_in_full(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    _, holder = pool.spawn()
    sample = h.broker.slots[GPU0].sample
    leases = []
    for _ in range(5):
        task = h.acquire(holder, mib=4096, wait_s=0.0)
        assert task.done(), "admitted without waiting for a sample"
        leases.append(task.result())
    assert h.broker.slots[GPU0].sample is sample  # no sample was taken in between
    assert _cap(h).outstanding_mib == 5 * 4096
    # the sixth (another process: behind its own leases the same one would be infeasible) no
    # longer fits by the booking: refused with the numbers, not granted
    _, other = pool.spawn()
    task = h.acquire(other, mib=4096, wait_s=0.0)
    h.tick(0.1)  # the expiry step answers a wait_s=0 request it evaluated (no clock move)
    assert task.done(), "still waiting (for a sample?) instead of refused on the numbers"
    err = task.exception()
    assert isinstance(err, RpcError) and err.name == "capacity_unavailable", err
    assert _cap(h).available_mib == TOTAL - HEADROOM - 5 * 4096


def test_a_sample_that_began_before_a_grant_shows_no_use_of_the_new_lease(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    proc, holder = pool.spawn()
    h.fake.allocate(GPU0, proc.pid, 3000)  # the holder allocates before it asks
    slot = h.broker.slots[GPU0]
    sampling = h.loop.create_task(h.broker._sample_once(slot))  # begins first...
    task = h.acquire(holder, mib=4096, wait_s=0.0)  # ...then the grant, on the older sample
    h.run(sampling)
    lease: Lease = task.result()
    assert slot.sample is not None and slot.sample.started_at <= lease.granted_at
    # the 3 000 MiB were held before the grant: outside the lease, which still books 4 096
    assert lease.observed_mib[GPU0] == 0
    assert h.broker.lessor.baselines[(holder, GPU0)] == 3000
    assert _cap(h).outstanding_mib == 4096
    # the view says whose they are: the holder's, outside its lease (the demo's check of
    # "others' use" counted them a second time and reported an over-admission)
    (gpu,) = h.broker.gpus_view()
    assert (gpu["other_in_use_mib"], gpu["held_outside_mib"]) == (3000, 3000)
    h.sample()  # and a sample after the grant does not move them into the lease either
    assert lease.observed_mib[GPU0] == 0
    assert _cap(h).outstanding_mib == 4096
    h.fake.allocate(GPU0, proc.pid, 1000)  # growth after the grant is the lease's use
    h.sample()
    assert lease.observed_mib[GPU0] == 1000
    assert _cap(h).outstanding_mib == 3096
    # someone else's memory is others' use and not held outside a lease
    stranger, _ = pool.spawn()
    h.fake.allocate(GPU0, stranger.pid, 500)
    h.sample()
    (gpu,) = h.broker.gpus_view()
    assert (gpu["other_in_use_mib"], gpu["held_outside_mib"]) == (3500, 3000)
    h.broker.release(lease.lease_id, lease.owner)  # with no lease, all of it is others'
    h.sample()
    (gpu,) = h.broker.gpus_view()
    assert (gpu["other_in_use_mib"], gpu["held_outside_mib"]) == (4500, 0)


def test_observed_use_discounts_only_what_device_used_holds(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    proc, holder = pool.spawn()
    task = h.acquire(holder, mib=4096, wait_s=0.0)
    lease = task.result()
    # the process list shows 4 000 MiB for the holder, but the device only 1 000 in use
    h.fake.set_gpu(GPU0, device_used_mib=1000, processes=(SimProcess(proc.pid, 4000),))
    h.sample()
    assert lease.observed_mib[GPU0] == 4000
    cap = _cap(h)
    # at most 1 000 MiB of the listing can be in device_used: 4 096 − 1 000 stay outstanding
    assert cap.device_used_mib == 1000
    assert cap.outstanding_mib == 4096 - 1000
    assert cap.available_mib == TOTAL - HEADROOM - 4096
    # a listing that fits device_used discounts in full
    h.fake.set_gpu(GPU0, device_used_mib=4000, processes=(SimProcess(proc.pid, 4000),))
    h.sample()
    assert _cap(h).outstanding_mib == 96
