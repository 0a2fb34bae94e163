"""The chaos checker's arithmetic (a pure unit: records and events in, figures out)."""

from __future__ import annotations

from integration.chaos.check import Kill, Outage, check_lane
from integration.chaos.common import Run


def run(id: str, ran_ms: int, pid: int = 1, due_ms: int = 1_000) -> Run:
    return Run(id, due_ms, ran_ms, pid)


def test_lost_early_strangers_and_lateness() -> None:
    figures = check_lane(
        "lane",
        exactly_once=True,
        batch=10,
        sent={"a": 1_000, "b": 1_000, "c": 1_000},
        runs=[run("a", 1_010), run("b", 990), run("z", 2_000)],
        kills=[],
        outages=[],
    )
    assert figures.lost == ["c"]
    assert figures.early == ["b"]
    assert figures.strangers == ["z"]
    assert sorted(figures.lateness_ms) == [-10, 10]
    assert not figures.ok()


def test_a_rerun_after_its_worker_was_killed_is_the_frameworks_not_a_duplicate() -> None:
    kill = Kill("lane", at_ms=5_000, pids=frozenset({7}))
    figures = check_lane(
        "lane",
        exactly_once=True,
        batch=10,
        sent={"a": 1_000},
        runs=[run("a", 4_000, pid=7), run("a", 20_000, pid=8)],
        kills=[kill],
        outages=[],
    )
    assert figures.duplicated == 0 and figures.reruns == 1
    assert figures.duplicates["worker_kill"] == ["a"]
    assert figures.ok()


def test_a_kill_long_after_the_run_explains_nothing() -> None:
    """A worker that ran a message and was killed a minute later had acknowledged it long before."""
    kill = Kill("lane", at_ms=70_000, pids=frozenset({7}))
    figures = check_lane(
        "lane",
        exactly_once=True,
        batch=10,
        sent={"a": 1_000},
        runs=[run("a", 4_000, pid=7), run("a", 80_000, pid=8)],
        kills=[kill],
        outages=[],
    )
    assert figures.duplicates["unexplained"] == ["a"]
    assert figures.duplicated == 1 and not figures.ok()


def test_kills_of_other_lanes_and_other_pids_explain_nothing() -> None:
    kills = [Kill("other", 5_000, frozenset({7})), Kill("lane", 5_000, frozenset({9}))]
    figures = check_lane(
        "lane", exactly_once=True, batch=10, sent={"a": 1_000},
        runs=[run("a", 4_000, pid=7), run("a", 6_000, pid=8)], kills=kills, outages=[],
    )  # fmt: skip
    assert figures.duplicates["unexplained"] == ["a"]
    assert figures.kills == 1


def test_broker_restart_and_failover_causes() -> None:
    restart = Outage("restart", "redis-server", frozenset({"lane"}), 10_000, 12_000)
    failover = Outage("failover", "sentinel", frozenset({"lane"}), 50_000, 54_000)
    figures = check_lane(
        "lane",
        exactly_once=False,
        batch=10,
        sent={"a": 1_000, "b": 1_000},
        runs=[run("a", 9_000), run("a", 15_000), run("b", 49_000), run("b", 70_000)],
        kills=[],
        outages=[restart, failover],
    )
    assert figures.duplicates["broker_restart"] == ["a"]
    assert figures.duplicates["failover"] == ["b"]
    assert (figures.restarts, figures.failovers) == (1, 1)
    assert figures.duplicated == 1 and figures.duplicate_bound == 10 and figures.ok()


def test_at_least_once_duplicates_of_leased_ids_are_bounded_by_a_batch_per_kill() -> None:
    leased = frozenset({"a", "b", "c"})
    kill = Kill("lane", 5_000, frozenset({99}), leased)
    runs = [run(id, t) for id in ("a", "b", "c") for t in (4_000, 30_000)]
    figures = check_lane(
        "lane", exactly_once=False, batch=2, sent=dict.fromkeys(leased, 1_000), runs=runs, kills=[kill], outages=[]
    )
    assert sorted(figures.duplicates["promoter_kill"]) == ["a", "b", "c"]
    assert figures.duplicate_bound == 2 and not figures.ok(), "three copies again after one kill: over a batch of 2"
    exactly = check_lane(
        "lane", exactly_once=True, batch=2, sent=dict.fromkeys(leased, 1_000), runs=runs, kills=[kill], outages=[]
    )
    # On the exactly-once hand-off a lease explains nothing: there is none.
    assert sorted(exactly.duplicates["unexplained"]) == ["a", "b", "c"] and exactly.duplicated == 3


def test_effectively_once_allows_no_duplicate_and_reports_the_drops() -> None:
    """With OnceMiddleware on an at-least-once lane the bound is 0: a duplicate still gets its cause, and fails."""
    leased = frozenset({"a", "b"})
    kill = Kill("lane", 5_000, frozenset({99}), leased)
    sent = dict.fromkeys(leased, 1_000)
    clean = check_lane(
        "lane", exactly_once=False, batch=50, sent=sent, runs=[run("a", 4_000), run("b", 4_000)], kills=[kill],
        outages=[], once=True,
    )  # fmt: skip
    clean.store = {"counter_duplicates_dropped": 2}
    summary = clean.summary()
    assert (summary["guarantee"], summary["duplicate_bound"], summary["dropped"], summary["ok"]) == (
        "effectively-once", 0, 2, True
    )  # fmt: skip
    slipped = check_lane(
        "lane", exactly_once=False, batch=50, sent=sent, runs=[run("a", 4_000), run("a", 30_000), run("b", 4_000)],
        kills=[kill], outages=[], once=True,
    )  # fmt: skip
    assert slipped.duplicates["promoter_kill"] == ["a"] and slipped.duplicated == 1 and not slipped.ok()


def test_effectively_once_allows_the_copies_of_a_run_whose_record_a_failover_took() -> None:
    """The guarantee runs twice what ran while the store failed over (its record lost with the old master's last
    writes, or not written while the store did not answer): a batch per failover, named ``failover``. The same copy
    of a run long before the failover is a promoter kill's, which effectively once must drop."""
    leased = frozenset({"a", "b"})
    kill = Kill("lane", 48_000, frozenset({99}), leased)
    failover = Outage("failover", "sentinel", frozenset({"lane"}), 50_000, 53_000)
    sent = dict.fromkeys(leased, 1_000)
    runs = [run("a", 51_000), run("a", 66_000), run("b", 57_500), run("b", 72_000)]
    figures = check_lane(
        "lane", exactly_once=False, batch=20, sent=sent, runs=runs, kills=[kill], outages=[failover], once=True
    )
    assert sorted(figures.duplicates["failover"]) == ["a", "b"], "during it, and within the margin after it"
    assert figures.duplicate_bound == 20 and figures.ok()
    assert figures.summary()["duplicate_runs"] == {"a": [(51_000, 1), (66_000, 1)], "b": [(57_500, 1), (72_000, 1)]}
    long_before = check_lane(
        "lane", exactly_once=False, batch=20, sent=sent, runs=[run("a", 30_000), run("a", 66_000), run("b", 30_000)],
        kills=[kill], outages=[failover], once=True,
    )  # fmt: skip
    assert long_before.duplicates["promoter_kill"] == ["a"] and not long_before.ok()
    without_once = check_lane(
        "lane", exactly_once=False, batch=20, sent=sent, runs=[run("a", 30_000), run("a", 66_000), run("b", 30_000)],
        kills=[], outages=[failover],
    )  # fmt: skip
    assert without_once.duplicates["failover"] == ["a"], "at least once: an unreplicated acknowledgement, 60 s back"
    too_far = check_lane(
        "lane", exactly_once=False, batch=20, sent=sent, runs=[run("a", 40_000), run("a", 66_000), run("b", 30_000)],
        kills=[], outages=[failover], once=True,
    )  # fmt: skip
    assert too_far.duplicates["unexplained"] == ["a"] and not too_far.ok()


def test_a_failed_targets_duplicates_are_printed_against_its_kills_and_outages() -> None:
    from integration.chaos.run import Report

    target = {
        "target": "lane", "ok": False, "lateness_ms": {"p50": 1, "p99": 2, "max": 3}, "by_cause": {"promoter_kill": 1},
        "duplicate_runs": {"a": [(12_000, 7), (27_500, 8)]},
    }  # fmt: skip
    report = Report("ci", 1, 60.0, {"summary": "here"}, [target])
    report.timeline = {
        "origin_ms": 10_000,
        "kills": [{"lane": "lane", "at_ms": 13_000}, {"lane": "other", "at_ms": 14_000}],
        "outages": [{"kind": "failover", "start_ms": 50_000, "end_ms": 53_500, "lanes": ["lane"]}],
    }
    assert list(report.duplicate_lines(target)) == [
        "lane kills at s: 3.0; outages: failover 40.0-43.5 s",
        "lane ran a at s: 2.0 (pid 7), 17.5 (pid 8)",
    ]
