"""Each worker slot's children get a uid of their own, claimed per machine.

The behaviour this buys (a fork hog on one worker does not starve another's threads) is tested in
test_sandbox_cgroups.py; these are the claims: disjoint between pools, given back, configurable.
"""

from __future__ import annotations

import os

import pytest

from rlcode.sandbox import SandboxPool, slot_uids

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="only root hands out uids")


def test_pools_of_one_machine_never_share_a_uid():
    """Guards the flock claims: two pools (two DDP ranks, say) sharing a uid would share its
    RLIMIT_NPROC again; a released uid is free for the next pool."""
    first, second = slot_uids.claim(3), slot_uids.claim(2)
    try:
        assert len(set(first.uids + second.uids)) == 5
        assert all(slot_uids.DEFAULT_BASE <= uid < slot_uids.DEFAULT_BASE + slot_uids.RANGE_SIZE
                   for uid in first.uids + second.uids)
        first.release()
        third = slot_uids.claim(3)
        assert not set(third.uids) & set(second.uids)
        third.release()
    finally:
        first.release()
        second.release()


def test_every_slot_of_a_pool_has_its_own_uid():
    with SandboxPool(workers=2, isolation="bwrap") as pool:
        assert len(set(pool._uids.uids)) == 3  # two workers and the reference worker
        uids = {pool.submit("import os; print(os.getuid(), os.getgid())").result().stdout for _ in range(6)}
        for line in uids:
            uid, gid = map(int, line.split())
            assert uid == gid and uid in pool._uids.uids
    assert pool._uids._locks == []  # closing the pool gave them back


def test_the_range_moves_with_the_environment(monkeypatch):
    monkeypatch.setenv(slot_uids.BASE_ENV, "1900000000")
    claimed = slot_uids.claim(1)
    try:
        assert 1_900_000_000 <= claimed.uids[0] < 1_900_000_000 + slot_uids.RANGE_SIZE
    finally:
        claimed.release()


@pytest.mark.parametrize("value", ["many", "0", "65534", str(2**31)])
def test_a_bad_uid_base_is_a_one_line_error_naming_the_fix(monkeypatch, value):
    monkeypatch.setenv(slot_uids.BASE_ENV, value)
    with pytest.raises(slot_uids.UidRangeError, match="fix: unset it") as error:
        SandboxPool(workers=1)
    assert "\n" not in str(error.value) and slot_uids.BASE_ENV in str(error.value)
