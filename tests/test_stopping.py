"""The run's StopToken (``rlcode.stopping``): a request is per process, the ranks' agreement is latched
and counted per stop point, and the decode loop may end rows only inside a collection."""

from __future__ import annotations

from rlcode.stopping import ANOTHER_RANK, StopPoint, StopToken


class FakeRanks:
    """Another rank's request and requeue, as the all-reduce would see them; counts the collectives."""

    def __init__(self, other: bool = False, other_requeue: bool = False) -> None:
        self.other, self.other_requeue, self.calls = other, other_requeue, 0

    def any(self, decision: bool) -> bool:
        self.calls += 1
        return decision or (self.other if self.calls % 2 else self.other_requeue)


def test_a_request_is_this_process_only_until_the_ranks_agree():
    token, ranks = StopToken(), FakeRanks()
    assert not token.requested() and not token.agreed(ranks, StopPoint.STEP_END)
    token.request("SIGTERM")
    assert token.requested() and token.signal == "SIGTERM"
    assert token.agreed(ranks, StopPoint.STEP_END) and not token.requeue


def test_agreed_latches_without_communicating_and_counts_every_ask():
    token, ranks = StopToken(), FakeRanks(other=True, other_requeue=True)
    assert token.agreed(ranks, StopPoint.AFTER_COLLECT)  # another rank's signal stops this one too
    calls = ranks.calls
    ranks.other = False
    assert token.agreed(ranks, StopPoint.STEP_END) and token.agreed(ranks, StopPoint.STEP_END)
    assert ranks.calls == calls, "once agreed, no collective"
    assert token.signal == ANOTHER_RANK and token.requeue and not token.requested()
    assert token.asks == {StopPoint.AFTER_COLLECT: 1, StopPoint.STEP_END: 2}
    token.new_fit()
    assert not token.agreed(ranks, StopPoint.STEP_END) and token.asks == {StopPoint.STEP_END: 1}


def test_rows_end_early_only_inside_a_collection():
    token = StopToken()
    token.request("SIGUSR1", requeue=True)
    assert not token.ends_rows(), "an eval's rows are never cut: no later ask would drop them"
    with token.collecting():
        assert token.ends_rows()
    assert not token.ends_rows() and token.requeue
