//! `attest-engine view` in a real browser: a history filled through the real
//! binary (two test sessions, a dynamic threshold that drifts, hostile trace
//! content, a `collect` run and an ECP run), served by the real binary, and
//! driven in Debian's headless Chromium with playwright-core
//! (`tests/viewer/check.mjs`). Screenshots of every page go to
//! `target/viewer-screenshots/`.

use crate::common::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const WORKSPACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// The keywords of the drifting assertion; a message with `k` of them scores `k / 4`.
const KW: [&str; 4] = ["alpha", "beta", "gamma", "delta"];

fn config(dir: &Path) -> PathBuf {
    let path = dir.join("attest.toml");
    std::fs::write(
        &path,
        format!(
            "history_path = \"{}\"\ndynamic_min_samples = 4\ndynamic_window = 6\n",
            dir.join("history.sqlite3").display()
        ),
    )
    .unwrap();
    path
}

fn session(cfg: &Path, sdk_version: &str) -> Engine {
    let mut cmd = command();
    cmd.env("ATTEST_CONFIG", cfg).arg("--log-level=warn");
    let mut e = Engine::spawn_command(cmd);
    let mut params = init_params();
    params["sdk_version"] = json!(sdk_version);
    let r = e.request(&initialize_request(json!(1), params));
    assert!(r.get("result").is_some(), "{r}");
    e
}

fn trace(id: &str, message: &str) -> Value {
    json!({
        "schema_version": 1,
        "trace_id": id,
        "agent_id": "support-bot",
        "input": {"user_message": "refund ORD-1"},
        "steps": [
            {"type": "llm_call", "name": "plan", "args": {"model": "gpt-4.1"}, "result": {"completion": "look it up"}},
            {"type": "tool_call", "name": "lookup_order", "args": {"order_id": "ORD-1"}, "result": {"status": "delivered"}},
            {"type": "tool_call", "name": "process_refund", "args": {"order_id": "ORD-1"}, "result": {"refund_id": "RFD-1"}}
        ],
        "output": {"message": message}
    })
}

/// Hostile content: markup in every string the page shows, a 1 MB string,
/// sub-traces as deep as the engine takes them, and more steps than the
/// page shows.
fn hostile_trace(id: &str) -> Value {
    let mut t = trace(id, "<script>document.title='pwned'</script> refund issued");
    t["steps"][1]["name"] = json!("<img src=x onerror=alert(1)>");
    t["steps"][1]["result"] = json!({"blob": "A".repeat(1_000_000)});
    let mut sub = json!({"schema_version": 1, "trace_id": format!("{id}-leaf"), "agent_id": "leaf", "steps": [{"type": "tool_call", "name": "leaf_tool"}], "output": {"message": "<b>leaf</b>"}});
    for depth in 0..4 {
        sub = json!({"schema_version": 1, "trace_id": format!("{id}-d{depth}"), "agent_id": format!("a{depth}"),
                     "steps": [{"type": "agent_call", "name": format!("delegate{depth}"), "sub_trace": sub}], "output": {"message": "ok"}});
    }
    let steps = t["steps"].as_array_mut().unwrap();
    steps.push(json!({"type": "agent_call", "name": "delegate", "sub_trace": sub}));
    steps.extend(
        (0..2500).map(
            |i| json!({"type": "retrieval", "name": format!("chunk{i}"), "args": {"deep": (0..60).fold(json!("x"), |v, _| json!([v]))}}),
        ),
    );
    t
}

fn assertions() -> Value {
    json!([
        {"assertion_id": "tone", "type": "content", "spec": {"target": "output.message", "check": "not_contains", "value": "<script>"}},
        {"assertion_id": "no_refund_tool", "type": "trace", "spec": {"check": "forbidden_tools", "tools": ["process_refund"], "soft": true}},
        {"assertion_id": "drifty", "type": "content", "spec": {"target": "output.message", "check": "keyword_all", "values": KW, "threshold": "dynamic"}}
    ])
}

/// Statuses of one `evaluate_batch`, by assertion id.
fn evaluate(e: &mut Engine, id: &str, t: Value) -> Vec<(String, String)> {
    let r = e.request(&evaluate_request(json!(id), t, assertions()));
    let results = r["result"]["results"].as_array().unwrap_or_else(|| panic!("{r}"));
    results
        .iter()
        .map(|r| {
            (
                r["assertion_id"].as_str().unwrap().to_owned(),
                r["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn message(found: usize) -> String {
    format!("{} refund issued", KW[..found].join(" "))
}

/// What the test sent, to hold the page to.
#[derive(Default)]
struct Sent {
    /// (assertion, status) of every session result.
    session: Vec<(String, String)>,
}

fn fill(dir: &Path) -> Sent {
    let cfg = config(dir);
    let mut sent = Sent::default();
    // Run 1: everything keyword-rich, nothing hostile.
    let mut a = session(&cfg, "0.9.0-run1");
    for i in 0..8 {
        sent.session
            .extend(evaluate(&mut a, &format!("a{i}"), trace(&format!("trc_a{i}"), &message(4))));
    }
    a.close_stdin();
    a.wait_exit();
    // Run 2: the drifting assertion falls to one keyword in four, and one
    // trace is hostile.
    let mut b = session(&cfg, "0.9.0-run2");
    for i in 0..4 {
        sent.session
            .extend(evaluate(&mut b, &format!("b{i}"), trace(&format!("trc_b{i}"), &message(1))));
    }
    sent.session.extend(evaluate(&mut b, "hostile", hostile_trace("trc_hostile")));
    b.close_stdin();
    b.wait_exit();

    // A collect run over the example traces.
    collect_examples(dir, ("ATTEST_CONFIG", cfg.to_str().unwrap()));

    // An ECP run of the example manifest (a standard-library agent).
    let out = command()
        .env("ATTEST_CONFIG", &cfg)
        .current_dir(WORKSPACE)
        .args(["--log-level=warn", "ecp", "run", "--manifest", "examples/ecp/manifest.yaml", "-q"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        matches!(out.status.code(), Some(0 | 2)),
        "ecp run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    sent
}

/// `collect` over the example traces with two rules of layers 2 and 3,
/// recording into the history `env` names.
fn collect_examples(dir: &Path, env: (&str, &str)) {
    let rules = dir.join("rules.yaml");
    std::fs::write(
        &rules,
        "rules:\n  - name: refund-flow\n    assertions:\n      - {assertion_id: ordered, type: trace, spec: {check: contains_in_order, tools: [lookup_order, process_refund]}}\n      - {assertion_id: short, type: constraint, spec: {field: steps.length, operator: lte, value: 1}}\n",
    )
    .unwrap();
    let out = command()
        .env(env.0, env.1)
        .args(["--log-level=warn", "collect", "--rules"])
        .arg(&rules)
        .arg("--jsonl")
        .arg(Path::new(WORKSPACE).join("examples/traces.jsonl"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "collect: {}", String::from_utf8_lossy(&out.stderr));
}

struct Viewer {
    child: Child,
    url: String,
}

impl Drop for Viewer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn view(history: &Path, extra: &[&str]) -> Viewer {
    view_with(history, extra, &[])
}

/// `attest-engine view` on a free loopback port, with `env`; its address
/// is read from the line it prints.
fn view_with(history: &Path, extra: &[&str], env: &[(&str, &str)]) -> Viewer {
    let mut args: Vec<std::ffi::OsString> = vec!["--history".into(), history.into()];
    args.extend(extra.iter().map(Into::into));
    serve(args, env)
}

/// `attest-engine view ARGS` on a free loopback port.
fn serve(args: Vec<std::ffi::OsString>, env: &[(&str, &str)]) -> Viewer {
    let mut child = command()
        .envs(env.iter().copied())
        .args(["view", "--addr", "127.0.0.1:0"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The serving line comes last (after what --results read).
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let url = loop {
        let mut line = String::new();
        if stderr.read_line(&mut line).unwrap() == 0 || seen.len() > 64 * 1024 {
            panic!("no address in {seen:?}");
        }
        let logged: Option<serde_json::Value> = serde_json::from_str(&line).ok();
        if let Some(url) = logged.as_ref().and_then(|l| l["url"].as_str()) {
            assert_eq!(logged.as_ref().unwrap()["command"], "view", "{line}");
            break url.trim_end_matches('/').to_owned();
        }
        seen.push_str(&line);
    };
    Viewer { child, url }
}

/// The overview's figure `id` (`stat-results`, `stat-runs`, …).
fn stat(page: &str, id: &str) -> usize {
    page.split(&format!("id=\"{id}\">"))
        .nth(1)
        .and_then(|rest| rest.split('<').next())
        .and_then(|n| n.replace(',', "").parse().ok())
        .unwrap_or_else(|| panic!("no {id} on the page: {page}"))
}

fn node_modules() -> Option<PathBuf> {
    let dir = std::env::var_os("VIEWER_NODE_MODULES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(WORKSPACE).join("target/viewer-node/node_modules"));
    dir.join("playwright-core").is_dir().then_some(dir)
}

fn count(conn: &rusqlite::Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

#[test]
fn the_viewer_shows_the_store_in_a_real_browser() {
    let chromium = PathBuf::from(std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into()));
    if !chromium.exists() {
        return attest_test_support::missing("Chromium is not installed", "apt-get install chromium").unwrap_or(());
    }
    let Some(modules) = node_modules() else {
        return attest_test_support::missing(
            "playwright-core is not installed",
            "scripts/test installs it into target/viewer-node (npm install --prefix target/viewer-node playwright-core)",
        )
        .unwrap_or(());
    };
    let dir = tempfile::tempdir().unwrap();
    let sent = fill(dir.path());
    let history = dir.path().join("history.sqlite3");

    // The store's own numbers, read with SQL.
    let conn = rusqlite::Connection::open(&history).unwrap();
    let results = count(&conn, "SELECT SUM(size) FROM batches");
    let runs = count(&conn, "SELECT COUNT(*) FROM runs");
    let kept = count(&conn, "SELECT COUNT(*) FROM kept");
    let kinds: Vec<String> = conn
        .prepare("SELECT kind FROM runs ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(kinds, ["session", "session", "collect", "ecp"]);
    let of = |id: &str, status: &str| sent.session.iter().filter(|(a, s)| a == id && s == status).count();
    // The drifting assertion passed all through run 1 and failed in run 2
    // once its dynamic threshold had learned run 1's scores.
    let drifty: Vec<&str> = sent
        .session
        .iter()
        .filter(|(a, _)| a == "drifty")
        .map(|(_, s)| s.as_str())
        .collect();
    assert!(
        drifty[..8].iter().all(|s| *s == "pass") && drifty[8..].contains(&"hard_fail"),
        "{drifty:?}"
    );

    let screenshots = Path::new(WORKSPACE).join("target/viewer-screenshots");
    std::fs::create_dir_all(&screenshots).unwrap();
    let viewer = view(&history, &[]);
    let expect = json!({
        "results": results,
        "runs": runs,
        "kept": kept,
        "tone": {"total": of("tone", "pass") + of("tone", "hard_fail"), "fail": of("tone", "hard_fail")},
        "drifty": {"total": 13, "pass": of("drifty", "pass"), "fail": of("drifty", "hard_fail")},
    });
    let out = Command::new("node")
        .arg(Path::new(WORKSPACE).join("tests/viewer/check.mjs"))
        .env("VIEWER_URL", &viewer.url)
        .env("VIEWER_EXPECT", expect.to_string())
        .env("VIEWER_SCREENSHOTS", &screenshots)
        .env("NODE_PATH", &modules)
        .env("PLAYWRIGHT_CORE", modules.join("playwright-core/index.mjs"))
        .env("CHROMIUM", &chromium)
        .output()
        .expect("running node");
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the browser checks failed:\n{log}");
    assert!(log.contains("all viewer checks passed"), "{log}");
    for page in ["overview", "assertion", "evaluation", "runs", "compare"] {
        assert!(screenshots.join(format!("{page}.png")).is_file(), "{page}.png");
    }
    drop(viewer);

    // A failing collect evaluation: the history kept its explanations, and
    // its trace is read from the traces file given with --traces (the one
    // `collect --jsonl` read; `--traces-out` files have the same lines).
    let kept_collect: i64 = count(
        &conn,
        "SELECT k.id FROM kept k JOIN batches b ON b.id = k.batch JOIN runs r ON r.id = b.run WHERE r.kind = 'collect' LIMIT 1",
    );
    let traces_out = Path::new(WORKSPACE).join("examples/traces.jsonl");
    let page = |viewer: &Viewer| {
        let out = Command::new("curl")
            .args(["-s", &format!("{}/evaluation/{kept_collect}", viewer.url)])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let without = page(&view(&history, &[]));
    assert!(without.contains("attest-engine view --traces FILE"), "{without}");
    let with = page(&view(&history, &["--traces", traces_out.to_str().unwrap()]));
    assert!(
        with.contains("From the <code>--traces</code> file") && with.contains("process_refund"),
        "{with}"
    );
}

#[test]
fn beyond_loopback_the_viewer_needs_a_token_and_checks_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let mut s = session(&cfg, "0.9.0");
    evaluate(&mut s, "x", trace("trc_x", &message(4)));
    s.close_stdin();
    s.wait_exit();
    let history = dir.path().join("history.sqlite3");
    let out = command()
        .args(["view", "--addr", "0.0.0.0:0", "--history"])
        .arg(&history)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is not a loopback address") && err.contains("--bearer-token-env"),
        "{err}"
    );

    let viewer = view_with(&history, &["--bearer-token-env", "VIEW_TOKEN"], &[("VIEW_TOKEN", "s3cret-token")]);
    let url = viewer.url.clone();
    let get = |path: &str, headers: &[(&str, &str)]| {
        let mut c = Command::new("curl");
        c.args(["-s", "-o", "/dev/null", "-w", "%{http_code}"]);
        for (k, v) in headers {
            c.args(["-H", &format!("{k}: {v}")]);
        }
        String::from_utf8(c.arg(format!("{url}{path}")).output().unwrap().stdout).unwrap()
    };
    assert_eq!(get("/", &[]), "401");
    assert_eq!(get("/", &[("Authorization", "Bearer wrong")]), "401");
    assert_eq!(get("/", &[("Authorization", "Bearer s3cret-token")]), "200");
    assert_eq!(get("/", &[("Cookie", "attest_view_token=s3cret-token")]), "200");
    // The token in the link is swapped for a cookie at once.
    assert_eq!(get("/runs?token=s3cret-token", &[]), "303");
    // Read-only.
    let post = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-X",
            "POST",
            "-H",
            "Authorization: Bearer s3cret-token",
        ])
        .arg(format!("{url}/"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&post.stdout), "405");
}

/// The README's quick start: the example history opens as it is in the
/// repository (read-only, in the current layout) and shows its results.
#[test]
fn the_example_history_opens_as_the_readme_says() {
    let example = Path::new(WORKSPACE).join("examples/history.sqlite3");
    let viewer = view(&example, &[]);
    let out = Command::new("curl").args(["-s", &format!("{}/", viewer.url)]).output().unwrap();
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(stat(&page, "stat-results") > 0, "{page}");
    let runs = page.split("id=\"stat-runs\">").nth(1).and_then(|r| r.split('<').next()).unwrap();
    assert_eq!(runs, "5", "three eval runs, a collect run and an ECP run");
    drop(viewer);
    // Nothing was written beside it.
    assert!(!Path::new(WORKSPACE).join("examples/history.sqlite3-wal").exists());
}

/// Results files and reports the real binary wrote (a session report of
/// `eval`, `collect --results-jsonl`, an ECP `--json-out` report) show
/// beside the history, each as a run of its own, and the history file is
/// not written.
#[test]
fn results_files_and_reports_show_beside_the_history() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let mut s = session(&cfg, "0.9.0");
    evaluate(&mut s, "x", trace("trc_x", &message(4)));
    s.close_stdin();
    s.wait_exit();
    let history = dir.path().join("history.sqlite3");
    let before = std::fs::read(&history).unwrap();
    let examples = Path::new(WORKSPACE).join("examples");
    let run = |args: &[&str]| {
        let out = command()
            .current_dir(WORKSPACE)
            .args(["--log-level=warn", "--no-history"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            matches!(out.status.code(), Some(0..=2)),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let report = dir.path().join("session.json");
    let (trace_file, assertions) = (examples.join("refund_trace.json"), examples.join("refund_assertions.json"));
    run(&[
        "eval",
        "--trace",
        trace_file.to_str().unwrap(),
        "--assertions",
        assertions.to_str().unwrap(),
        "--report",
        &format!("json={}", report.display()),
    ]);
    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        "rules:\n  - name: refund-flow\n    assertions:\n      - {assertion_id: ordered, type: trace, spec: {check: contains_in_order, tools: [lookup_order, process_refund]}}\n",
    )
    .unwrap();
    let results = dir.path().join("results.jsonl");
    run(&[
        "collect",
        "--rules",
        rules.to_str().unwrap(),
        "--jsonl",
        examples.join("traces.jsonl").to_str().unwrap(),
        "--results-jsonl",
        results.to_str().unwrap(),
    ]);
    let ecp = dir.path().join("ecp.json");
    run(&[
        "ecp",
        "run",
        "--manifest",
        "examples/ecp/manifest.yaml",
        "-q",
        "--json-out",
        ecp.to_str().unwrap(),
    ]);

    // What each file holds, counted from the files themselves.
    let read = |p: &Path| serde_json::from_slice::<Value>(&std::fs::read(p).unwrap()).unwrap();
    let in_report: usize = read(&report)["traces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["results"].as_array().unwrap().len())
        .sum();
    let in_results = std::fs::read_to_string(&results).unwrap().lines().count();
    let in_ecp = read(&ecp)["total"].as_u64().unwrap() as usize;
    assert!(in_report > 0 && in_results > 0 && in_ecp > 0);
    let conn = rusqlite::Connection::open_with_flags(&history, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let in_history = count(&conn, "SELECT SUM(size) FROM batches") as usize;
    drop(conn);

    let files = [report.to_str().unwrap(), results.to_str().unwrap(), ecp.to_str().unwrap()];
    let viewer = view(&history, &["--results", files[0], "--results", files[1], "--results", files[2]]);
    let page = String::from_utf8_lossy(
        &Command::new("curl")
            .args(["-s", &format!("{}/", viewer.url)])
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    assert_eq!(stat(&page, "stat-results"), in_history + in_report + in_results + in_ecp, "{page}");
    assert_eq!(stat(&page, "stat-runs"), 4, "the session, and a run per file");
    let runs = String::from_utf8_lossy(
        &Command::new("curl")
            .args(["-s", &format!("{}/runs", viewer.url)])
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    for label in ["report ", "results ", "ecp run "] {
        assert!(runs.contains(label), "no {label:?} run: {runs}");
    }
    drop(viewer);
    assert_eq!(std::fs::read(&history).unwrap(), before, "the history was not written");

    // A file that is none of these is refused, naming the forms.
    let out = command()
        .args(["view", "--addr", "127.0.0.1:0", "--results"])
        .arg(&rules)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a result line of collect --results-jsonl"), "{err}");
}

/// A fleet's shared PostgreSQL history opens in the viewer as a history
/// file does: its newest results, read without writing to the database.
#[test]
fn a_postgres_history_opens_in_the_viewer() {
    let Some(pg) = attest_test_support::PostgresServer::start() else {
        return;
    };
    let url = pg.database("attest");
    let dir = tempfile::tempdir().unwrap();
    collect_examples(dir.path(), ("ATTEST_HISTORY_URL", &url));
    let stored: usize = pg.psql("attest", "SELECT count(*) FROM attest_results").trim().parse().unwrap();
    let failing: usize = pg
        .psql("attest", "SELECT count(*) FROM attest_results WHERE status <> 'pass'")
        .trim()
        .parse()
        .unwrap();
    assert!(stored > 0 && failing > 0, "{stored} {failing}");

    // The URL as --history, and as the configured history.
    for viewer in [view_url(&url, &[]), view_url("", &[("ATTEST_HISTORY_URL", url.as_str())])] {
        let page = String::from_utf8_lossy(
            &Command::new("curl")
                .args(["-s", &format!("{}/", viewer.url)])
                .output()
                .unwrap()
                .stdout,
        )
        .into_owned();
        assert_eq!(stat(&page, "stat-results"), stored, "{page}");
        assert!(page.contains("refund-flow&#x2f;ordered"), "{page}");
    }
    assert_eq!(
        pg.psql("attest", "SELECT count(*) FROM attest_results").trim(),
        stored.to_string(),
        "nothing was written"
    );
}

/// `attest-engine view` of `history` (a URL, or none for the configured
/// one) on a free loopback port.
fn view_url(history: &str, env: &[(&str, &str)]) -> Viewer {
    let mut args: Vec<std::ffi::OsString> = Vec::new();
    if !history.is_empty() {
        args.extend(["--history".into(), history.into()]);
    }
    serve(args, env)
}
