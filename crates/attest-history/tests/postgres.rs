//! The shared PostgreSQL store against a real server (Debian's
//! `postgresql`, started per test by `attest_test_support::PostgresServer`).

use attest_history::{DriftStatus, Fingerprint, History, HistoryConfig, Location, Row, Rows, SpecDigest, Subject};
use attest_test_support::PostgresServer;
use std::time::{Duration, Instant};

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

fn config(url: &str) -> HistoryConfig {
    HistoryConfig {
        location: Location::Postgres(url.to_owned()),
        max_rows: 1_000_000,
        max_age: Duration::from_secs(3600),
        max_bytes: 1 << 30,
        wait_when_behind: false,
        kept_evaluations: attest_history::DEFAULT_KEPT_EVALUATIONS,
        kept_bytes: attest_history::DEFAULT_KEPT_BYTES,
    }
}

fn rows(trace: &str, id: &str, spec: SpecDigest, scores: &[f64], keyed: bool) -> Rows {
    Rows {
        keyed,
        run: None,
        kept: None,
        trace_id: trace.into(),
        agent_id: Some("agent".into()),
        rows: scores
            .iter()
            .map(|&score| Row {
                assertion_id: id.into(),
                spec,
                assertion_type: "content",
                status: if score >= 0.5 {
                    attest_trace::Status::Pass
                } else {
                    attest_trace::Status::HardFail
                },
                score,
                cost: 0.0,
            })
            .collect(),
        recorded_at_ms: None,
    }
}

#[test]
fn results_are_shared_read_back_and_counted_once() {
    let Some(pg) = PostgresServer::start() else { return };
    let url = pg.database("shared");
    let spec = SpecDigest::of("content", None);
    let fp = Fingerprint::new(&spec, Some("agent"));
    // Two processes of a fleet, each with its own connections.
    let a = History::open(&config(&url)).unwrap();
    let b = History::open(&config(&url)).unwrap();
    a.record(rows("run1", "a1", spec, &[0.9, 0.8], false));
    assert_eq!(
        a.recent_scores(fp, 10, soon()).unwrap(),
        vec![0.8, 0.9],
        "a query sees the rows queued before it"
    );
    b.record_committed(vec![rows("t-1", "rule/a", spec, &[0.2], true)], soon()).unwrap();
    // A redelivery, through the other process: stored once.
    a.record_committed(vec![rows("t-1", "rule/a", spec, &[0.2], true)], soon()).unwrap();
    b.record_committed(
        vec![rows("t-1", "rule/a", spec, &[0.2], true), rows("t-2", "rule/a", spec, &[0.7], true)],
        soon(),
    )
    .unwrap();
    assert_eq!(b.recent_scores(fp, 10, soon()).unwrap(), vec![0.7, 0.2, 0.8, 0.9]);
    let r = a.drift(Subject::AssertionId("a1".into()), 50, soon()).unwrap();
    assert_eq!((r.count, r.latest_score, r.assertion_id.as_str()), (4, 0.7, "a1"));
    let r = a.drift(Subject::Fingerprint(fp), 2, soon()).unwrap();
    assert_eq!((r.count, r.assertion_id.as_str()), (2, "rule/a"));
    assert_eq!(
        a.drift(Subject::AssertionId("never".into()), 5, soon()).unwrap().status,
        DriftStatus::NoData
    );
    // What a user reads with plain SQL.
    let stored = pg.psql(
        "shared",
        "SELECT trace_id, assertion_id, status, score FROM attest_results WHERE keyed ORDER BY id",
    );
    assert_eq!(stored, "t-1|rule/a|hard_fail|0.2\nt-2|rule/a|pass|0.7\n");
    // Text PostgreSQL cannot hold is kept, not refused with the batch.
    a.record_committed(vec![rows("nul\0id", "x\0y", spec, &[1.0], true)], soon())
        .unwrap();
    assert_eq!(
        pg.psql("shared", "SELECT count(*) FROM attest_results WHERE trace_id = 'nul\u{FFFD}id'"),
        "1\n"
    );
}

#[test]
fn a_fleet_starting_together_migrates_once() {
    let Some(pg) = PostgresServer::start() else { return };
    let url = pg.database("fleet");
    let opened: Vec<_> = (0..12)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || History::open(&config(&url)).map(drop))
        })
        .collect();
    for o in opened {
        o.join().unwrap().expect("every process opens the store");
    }
    assert_eq!(
        pg.psql("fleet", "SELECT string_agg(version::text, ',') FROM attest_history_migrations"),
        "1\n"
    );
    // A layout from a newer engine is refused, not written.
    pg.psql("fleet", "INSERT INTO attest_history_migrations (version) VALUES (99)");
    let e = History::open(&config(&url)).err().expect("a newer layout is refused").to_string();
    assert!(e.contains("layout version 99") && e.contains("upgrade attest-engine"), "{e}");
}

#[test]
fn retention_keeps_the_newest_results() {
    let Some(pg) = PostgresServer::start() else { return };
    let url = pg.database("retention");
    let spec = SpecDigest::of("content", None);
    {
        let h = History::open(&config(&url)).unwrap();
        let scores: Vec<f64> = (0..30).map(|i| i as f64 / 100.0).collect();
        h.record_committed(vec![rows("t", "a", spec, &scores, false)], soon()).unwrap();
    }
    let mut c = config(&url);
    c.max_rows = 10;
    let h = History::open(&c).unwrap();
    let fp = Fingerprint::new(&spec, Some("agent"));
    let kept = h.recent_scores(fp, 100, soon()).unwrap();
    assert_eq!(kept.len(), 10);
    assert_eq!(kept[0], 0.29, "the newest stay");
}

#[test]
fn an_unreachable_or_wrong_database_is_a_clear_error_without_the_password() {
    let Some(pg) = PostgresServer::start() else { return };
    let start = Instant::now();
    // Nothing listens on port 9 (discard) on loopback.
    let e = History::open(&config("postgres://attest:s3cret@127.0.0.1:9/x"))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("cannot connect") && e.contains("running and reachable"), "{e}");
    assert!(!e.contains("s3cret") && e.contains(":***@"), "{e}");
    assert!(start.elapsed() < Duration::from_secs(15));
    let e = History::open(&config(&pg.url().replace("/postgres", "/nosuchdb")))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("does not exist") && e.contains("createdb"), "{e}");
    let e = History::open(&config("postgres://[bad")).err().unwrap().to_string();
    assert!(e.contains("not a PostgreSQL connection string"), "{e}");
}

#[test]
fn a_restarted_server_is_reconnected_and_a_failed_commit_says_so() {
    let Some(pg) = PostgresServer::start() else { return };
    let url = pg.database("restart");
    let spec = SpecDigest::of("content", None);
    let h = History::open(&config(&url)).unwrap();
    h.record_committed(vec![rows("t1", "a", spec, &[0.5], true)], soon()).unwrap();
    pg.stop();
    let e = h.record_committed(vec![rows("t2", "a", spec, &[0.5], true)], soon()).unwrap_err();
    assert!(format!("{e:#}").contains("did not commit"), "{e:#}");
    pg.start_again();
    // The broken connection is replaced; the retried rows land once.
    h.record_committed(vec![rows("t2", "a", spec, &[0.5], true)], soon()).unwrap();
    h.record_committed(vec![rows("t2", "a", spec, &[0.5], true)], soon()).unwrap();
    assert_eq!(
        pg.psql("restart", "SELECT string_agg(trace_id, ',' ORDER BY id) FROM attest_results"),
        "t1,t2\n"
    );
}
