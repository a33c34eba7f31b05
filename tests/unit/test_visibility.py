"""The PostgreSQL visibility rule: rows a chunk read stale because a transaction logged
before the open watermark was not yet visible to the chunk's snapshot."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from signals.names import TableId
from snapshotter.core.position import Position
from snapshotter.core.visibility import (
    IDLE_IN_TRANSACTION,
    AllSnapshots,
    OpenAtStart,
    OpenTransaction,
    PgSnapshot,
    RecentTransactions,
    widen_xid,
)

T = TableId("public", "t")
U = TableId("public", "u")


def test_parse_and_sees() -> None:
    snap = PgSnapshot.parse("100:110:102,105")
    assert (snap.xmin, snap.xmax, snap.xip) == (100, 110, frozenset({102, 105}))
    assert snap.sees(99)  # before xmin: committed before the snapshot
    assert snap.sees(101)
    assert not snap.sees(102)  # in progress when the snapshot was taken
    assert not snap.sees(105)
    assert not snap.sees(110)  # at xmax: started after
    assert not snap.sees(200)
    assert snap.sees(2)  # frozen
    assert snap.settled(99) and not snap.settled(100)


@pytest.mark.parametrize("text", ["", "1:2", "a:b:", "5:3:", "1:10:11", "0:0:"])
def test_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        PgSnapshot.parse(text)


def test_epoch_wraparound() -> None:
    # 64-bit ids of epoch 1; the log's 32-bit xids wrap.
    base = 1 << 32
    snap = PgSnapshot(base + 5, base + 20, frozenset({base + 7}))
    assert not snap.sees(7)
    assert snap.sees(6)
    assert snap.sees((1 << 32) - 3)  # epoch 0, just before the wrap: long committed
    assert not snap.sees(25)


@given(st.integers(0, (1 << 32) - 1), st.integers(1 << 31, (1 << 40)))
def test_widen_is_nearest(xid: int, reference: int) -> None:
    full = widen_xid(xid, reference)
    assert full & 0xFFFFFFFF == xid
    assert abs(full - reference) <= 1 << 31


def _history(*txns: tuple[int, int, TableId, list[int]]) -> RecentTransactions:
    history = RecentTransactions()
    for xid, lsn, table, keys in txns:
        history.touch(xid, table, [(k,) for k in keys])
        history.commit(xid, Position(lsn, 0))
    return history


def test_stale_keys_are_those_of_invisible_transactions_before_the_open_watermark() -> None:
    history = _history(
        (101, 10, T, [1, 2]),  # visible: the chunk saw it
        (102, 11, T, [3]),  # in xip: committed in the log, invisible to the chunk
        (103, 12, U, [4]),  # invisible, but another table
        (105, 30, T, [5]),  # invisible, but after the open watermark: the window handles it
    )
    snap = PgSnapshot(102, 106, frozenset({102, 103, 105}))
    assert history.stale_keys(T, snap, before=Position(20, 0)) == {(3,)}
    assert history.stale_keys(U, snap, before=Position(20, 0)) == {(4,)}


def test_at_or_after_xmax_is_invisible() -> None:
    history = _history((110, 10, T, [7]))
    assert history.stale_keys(T, PgSnapshot(105, 110), before=Position(20, 0)) == {(7,)}


def test_overflow_and_forgetting_force_a_reread_only_when_it_matters() -> None:
    history = RecentTransactions(max_keys=3)
    history.touch(200, T, [(i,) for i in range(10)])  # one huge transaction
    history.commit(200, Position(5, 0))
    assert history.size == 0
    assert history.stale_keys(T, PgSnapshot(199, 210, frozenset({200})), Position(9, 0)) is None
    assert history.stale_keys(T, PgSnapshot(201, 210), Position(9, 0)) == set()
    # Evicted for size: same rule.
    small = _history((300, 1, T, [1, 2]), (301, 2, T, [3, 4]))
    small.max_keys = 3
    small.touch(302, T, [(9,)])
    small.commit(302, Position(3, 0))
    assert small.size <= 3
    assert small.stale_keys(T, PgSnapshot(299, 310, frozenset({300})), Position(9, 0)) is None


def test_prune_forgets_what_every_later_snapshot_sees() -> None:
    history = _history((101, 1, T, [1]), (102, 2, T, [2]), (150, 3, T, [3]))
    history.prune(PgSnapshot(120, 130))
    assert history.size == 1
    history.clear()
    assert history.size == 0


def test_prune_keeps_what_an_older_snapshot_still_waiting_to_close_missed() -> None:
    # Parallel reads: chunk A read with an older snapshot (102 in progress), chunk B with a
    # newer one (102 visible). B's window closes first; A's still asks about 102 later.
    history = _history((102, 2, T, [2]))
    older, newer = PgSnapshot(102, 103, frozenset({102})), PgSnapshot(103, 103)
    history.prune(newer, older)
    assert history.stale_keys(T, older, Position(9, 0)) == {(2,)}
    history.prune(newer)  # A closed: nothing left that needs it
    assert history.size == 0


# The decision as a property: for random transactions and a random snapshot, the stale set
# is exactly the oracle's - keys of transactions committed before the watermark that the
# snapshot does not see.
@given(
    st.lists(
        st.tuples(st.integers(100, 140), st.sets(st.integers(0, 20), max_size=4)),
        max_size=15,
        unique_by=lambda t: t[0],
    ),
    st.integers(100, 140),
    st.integers(0, 40),
    st.sets(st.integers(100, 140)),
    st.integers(0, 16),
)
def test_stale_keys_match_an_oracle(
    txns: list[tuple[int, set[int]]], xmin: int, span: int, xip: set[int], cut: int
) -> None:
    xmax = xmin + span
    snap = PgSnapshot(xmin, xmax, frozenset(x for x in xip if xmin <= x < xmax))
    history = RecentTransactions()
    for lsn, (xid, keys) in enumerate(txns, start=1):
        history.touch(xid, T, [(k,) for k in keys])
        history.commit(xid, Position(lsn, 0))
    expected = {
        (k,)
        for lsn, (xid, keys) in enumerate(txns, start=1)
        if lsn < cut and not snap.sees(xid)
        for k in keys
    }
    assert history.stale_keys(T, snap, Position(cut, 0)) == expected


# Across a restart: the log resumes after transactions whose commits may still be invisible.

IDLE = "idle in transaction"


def _session(xid: int, state: str | None = IDLE, **kwargs: Any) -> OpenTransaction:
    kwargs.setdefault("client", state is not None)
    return OpenTransaction(xid, pid=1000 + xid, state=state, **kwargs)


def _started(assigned: int, snapshot: PgSnapshot, *sessions: OpenTransaction) -> RecentTransactions:
    history = RecentTransactions()
    history.started(OpenAtStart(assigned, snapshot, sessions))
    return history


def test_a_chunk_missing_a_transaction_open_at_the_start_is_read_again() -> None:
    # Asked at start: xid 112 assigned and ended, then the snapshot 100:113:100,104,110.
    history = _started(112, PgSnapshot(100, 113, frozenset({100, 104, 110})))
    assert sorted(history.open_at_start) == [100, 104, 110]
    missing = PgSnapshot(104, 114, frozenset({104}))  # 104 may have committed before R
    assert history.stale_keys(T, missing, Position(50, 0)) is None
    assert [t.xid for t in history.missed_at_start(missing)] == [104]
    assert history.stale_keys(T, PgSnapshot(110, 114, frozenset({110})), Position(50, 0)) is None
    # Every one of them ended: nothing to fear.
    assert history.stale_keys(T, PgSnapshot(113, 114), Position(50, 0)) == set()
    assert history.stale_keys(T, PgSnapshot(99, 120, frozenset({99, 115})), Position(50, 0)) == (
        set()
    )


def test_only_what_the_start_snapshot_lists_below_the_assigned_xid_is_in_doubt() -> None:
    # 101..103 had ended (visible or aborted): not invisible, so not a commit before R.
    # 115 began after the question, so its commit comes after R: the log brings it.
    history = _started(112, PgSnapshot(100, 120, frozenset({100, 115})))
    assert list(history.open_at_start) == [100]
    assert history.stale_keys(T, PgSnapshot(101, 121, frozenset({101, 115})), Position(9, 0)) == (
        set()
    )


def test_a_snapshot_taken_before_the_assigned_xid_ended_is_refused() -> None:
    # Its xmax would not be past a commit before R that is unlisted: the question is wrong.
    with pytest.raises(ValueError, match="before xid 112 ended"):
        OpenAtStart(112, PgSnapshot(100, 112, frozenset({100})))


def test_the_log_bringing_its_commit_takes_it_out_of_doubt() -> None:
    history = _started(110, PgSnapshot(104, 111, frozenset({104, 106, 108})))
    history.touch(104, T, [(7,)])
    history.commit(104, Position(20, 0))  # its commit came through the log (replayed or new)
    history.abort(108)  # an abort too (a reader that sends them)
    missing = PgSnapshot(104, 111, frozenset({104, 108}))
    # Only 104 and 108 missed: the history knows 104's keys, 108 wrote nothing visible.
    assert history.stale_keys(T, missing, Position(50, 0)) == {(7,)}
    assert list(history.open_at_start) == [106]  # never seen in the log: still in doubt
    assert history.stale_keys(T, PgSnapshot(104, 111, frozenset({106})), Position(50, 0)) is None


def test_the_log_xid_is_32_bit_the_doubt_is_as_the_snapshot_was() -> None:
    epoch = 1 << 32
    history = _started(
        epoch + 9, PgSnapshot(epoch + 5, epoch + 10, frozenset({epoch + 5, epoch + 6}))
    )
    assert sorted(history.open_at_start) == [5, 6]
    missing = PgSnapshot(epoch + 5, epoch + 12, frozenset({epoch + 5, epoch + 6}))
    assert history.stale_keys(T, missing, Position(50, 0)) is None
    history.commit(5, Position(10, 0))
    history.commit(6, Position(11, 0))
    assert history.stale_keys(T, missing, Position(50, 0)) == set()


@pytest.mark.parametrize("state", [IDLE, "idle in transaction (aborted)"])
def test_a_session_idle_in_its_transaction_is_not_in_doubt(state: str) -> None:
    # It cannot have written a commit record (it executes no command): core.visibility, 3.
    history = _started(110, PgSnapshot(104, 111, frozenset({104})), _session(104, state))
    assert not history.open_at_start
    assert history.stale_keys(T, PgSnapshot(104, 112, frozenset({104})), Position(9, 0)) == set()


@pytest.mark.parametrize(
    "session",
    [
        _session(104, "active"),  # maybe executing its COMMIT (stuck in a sync-rep wait)
        _session(104, None),  # another role's session: its state is hidden
        _session(104, IDLE, client=False),  # not a client backend
        OpenTransaction(104, state=IDLE, client=True, prepared="g1"),  # prepared: no session
        _session(104, "fastpath function call"),
        _session(104, "disabled"),  # track_activities off
    ],
    ids=["active", "hidden", "not-a-client", "prepared", "fastpath", "disabled"],
)
def test_any_other_transaction_open_at_the_start_stays_in_doubt(session: OpenTransaction) -> None:
    history = _started(110, PgSnapshot(104, 111, frozenset({104})), session)
    missing = PgSnapshot(104, 112, frozenset({104}))
    assert history.stale_keys(T, missing, Position(9, 0)) is None
    assert history.missed_at_start(missing) == [session]


def test_of_two_rows_of_one_xid_a_busy_one_counts() -> None:
    # A leader idle, a worker of it active (not possible, but no row order can hide it).
    for rows in (
        (_session(104), _session(104, "active")),
        (_session(104, "active"), _session(104)),
    ):
        history = _started(110, PgSnapshot(104, 111, frozenset({104})), *rows)
        assert [t.state for t in history.open_at_start.values()] == ["active"]


def test_an_unlisted_session_of_another_xid_changes_nothing() -> None:
    history = _started(110, PgSnapshot(104, 111, frozenset({104})), _session(105))
    assert [t.xid for t in history.missed_at_start(PgSnapshot(104, 112, frozenset({104})))] == [104]


def test_the_log_history_still_drops_what_it_knows() -> None:
    history = _history((104, 20, T, [7]))
    history.started(OpenAtStart(104, PgSnapshot(104, 105)))
    ended = PgSnapshot(105, 106)
    assert history.stale_keys(T, ended, Position(50, 0)) == set()
    history.touch(106, T, [(8,)])
    history.commit(106, Position(60, 0))
    assert history.stale_keys(T, PgSnapshot(106, 107, frozenset({106})), Position(70, 0)) == {(8,)}


def test_a_snapshot_that_sees_them_ended_forgets_them_unless_an_older_one_can_ask() -> None:
    history = _started(105, PgSnapshot(103, 106, frozenset({103, 104})))
    older, newer = PgSnapshot(104, 111, frozenset({104})), PgSnapshot(105, 111)
    history.prune(newer, older)  # the older window has not closed: 104 stays in doubt
    assert list(history.open_at_start) == [104]
    assert history.stale_keys(T, older, Position(50, 0)) is None
    history.prune(newer)
    assert history.stale_keys(T, older, Position(50, 0)) == set()


# The decision across a restart as a property: a chunk is read again exactly when its
# snapshot misses a transaction the start snapshot listed below the assigned xid, that no
# idle session held and whose end the log has not brought.
@given(
    st.sets(st.integers(100, 130), max_size=8),
    st.dictionaries(
        st.integers(100, 130),
        st.sampled_from([IDLE, "active", None, "idle in transaction (aborted)"]),
        max_size=8,
    ),
    st.sets(st.integers(100, 130), max_size=6),
    st.sets(st.integers(100, 140), max_size=8),
    st.integers(100, 140),
)
def test_read_again_matches_an_oracle(
    listed: set[int],
    states: dict[int, str | None],
    logged: set[int],
    chunk_xip: set[int],
    chunk_xmax: int,
) -> None:
    assigned = 125
    start = PgSnapshot(min(listed, default=131), 131, frozenset(listed))
    history = _started(assigned, start, *(_session(x, s) for x, s in states.items()))
    for lsn, xid in enumerate(sorted(logged), start=1):
        history.commit(xid, Position(lsn, 0))
    xip = frozenset(x for x in chunk_xip if x < chunk_xmax)
    chunk = PgSnapshot(min(xip, default=chunk_xmax), chunk_xmax, xip)
    doubt = {
        x
        for x in listed
        if x < assigned and states.get(x, "active") not in IDLE_IN_TRANSACTION and x not in logged
    }
    expected = any(not chunk.sees(x) for x in doubt)
    assert (history.stale_keys(T, chunk, Position(99, 0)) is None) == expected


def test_all_snapshots_see_a_transaction_only_if_each_does() -> None:
    both = AllSnapshots((PgSnapshot(10, 20), PgSnapshot(12, 20, frozenset({12}))))
    assert not both.sees(12)
    assert both.sees(13)
    history = _started(19, PgSnapshot(12, 20, frozenset({12})))
    assert history.stale_keys(T, both, Position(9, 0)) is None
