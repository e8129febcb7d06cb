//! The pages: overview, an assertion, a failing evaluation, runs and two
//! runs compared. Each reads the history through one [`Reader`] and renders
//! a template; every list is paginated, every value from a trace escaped.

use crate::charts;
use crate::tree;
use crate::App;
use attest_history::read::{AssertionSummary, Reader, Snapshot};
use attest_trace::Status;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use minijinja::{context, Environment};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Rows on one page of a list.
pub const PAGE_ROWS: usize = 50;
/// Longest search text kept.
const MAX_SEARCH: usize = 200;

pub struct Pages {
    reader: Mutex<Reader>,
    snapshot: Mutex<Option<Arc<Snapshot>>>,
    env: Environment<'static>,
    window: usize,
    file: String,
    /// `--traces` files, searched for traces the history did not keep.
    traces: Vec<std::path::PathBuf>,
}

/// Bytes of `--traces` files read to find one trace; past it the search
/// gives up (the page says so).
pub const MAX_TRACE_SEARCH_BYTES: u64 = 512 << 20;

/// The newest line of `files` whose trace has id `trace_id`, reading at most
/// [`MAX_TRACE_SEARCH_BYTES`] in all and lines of at most 16 MiB.
fn find_trace(files: &[std::path::PathBuf], trace_id: &str) -> Option<String> {
    use std::io::BufRead;
    let needle = format!("\"trace_id\":{}", serde_json::to_string(trace_id).ok()?);
    let mut budget = MAX_TRACE_SEARCH_BYTES;
    let mut found = None;
    for path in files {
        let Ok(file) = std::fs::File::open(path) else { continue };
        let mut reader = std::io::BufReader::new(file);
        let mut line = Vec::new();
        loop {
            line.clear();
            let Ok(n) = std::io::Read::take(&mut reader, (16 << 20).min(budget)).read_until(b'\n', &mut line) else {
                break;
            };
            if n == 0 {
                break;
            }
            budget = budget.saturating_sub(n as u64);
            if memchr::memmem::find(&line, needle.as_bytes()).is_some() {
                let text = String::from_utf8_lossy(&line).trim_end().to_owned();
                // The top-level id, not a sub-trace's.
                if serde_json::from_str::<serde_json::Value>(&text)
                    .ok()
                    .is_some_and(|v| v["trace_id"] == trace_id)
                {
                    found = Some(text);
                }
            }
            if budget == 0 {
                return found;
            }
        }
    }
    found
}

impl Pages {
    pub fn open(history: &Path, window: usize, traces: Vec<std::path::PathBuf>) -> anyhow::Result<Pages> {
        let reader = Reader::open(history)?;
        let mut env = Environment::new();
        for (name, source) in [
            ("base.html", include_str!("../templates/base.html")),
            ("macros.html", include_str!("../templates/macros.html")),
            ("overview.html", include_str!("../templates/overview.html")),
            ("assertion.html", include_str!("../templates/assertion.html")),
            ("evaluation.html", include_str!("../templates/evaluation.html")),
            ("runs.html", include_str!("../templates/runs.html")),
            ("compare.html", include_str!("../templates/compare.html")),
            ("missing.html", include_str!("../templates/missing.html")),
        ] {
            env.add_template(name, source)?;
        }
        Ok(Pages {
            reader: Mutex::new(reader),
            snapshot: Mutex::new(None),
            env,
            window,
            file: history.display().to_string(),
            traces,
        })
    }

    /// The whole history summed, made again only when the file changed.
    fn snapshot(&self) -> anyhow::Result<Arc<Snapshot>> {
        let mut reader = self.reader.lock().unwrap_or_else(|e| e.into_inner());
        let mut cached = self.snapshot.lock().unwrap_or_else(|e| e.into_inner());
        if reader.changed()? || cached.is_none() {
            *cached = Some(Arc::new(reader.snapshot(self.window)?));
        }
        Ok(cached.clone().unwrap_or_default())
    }

    fn render(&self, name: &str, ctx: minijinja::Value) -> Response {
        match self.env.get_template(name).and_then(|t| t.render(ctx)) {
            Ok(html) => Html(html).into_response(),
            Err(e) => {
                tracing::error!(error = %e, template = name, "cannot render page");
                (StatusCode::INTERNAL_SERVER_ERROR, format!("cannot render {name}: {e}")).into_response()
            }
        }
    }

    fn missing(&self, what: String) -> Response {
        let mut r = self.render("missing.html", context! { what, file => &self.file });
        *r.status_mut() = StatusCode::NOT_FOUND;
        r
    }
}

pub fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/", get(overview))
        .route("/assertion/{id}", get(assertion))
        .route("/evaluation/{id}", get(evaluation))
        .route("/runs", get(runs))
        .route("/compare", get(compare))
        .route("/assets/style.css", get(style))
        .fallback(not_found)
}

async fn style() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=3600"),
        ],
        include_str!("../assets/style.css"),
    )
        .into_response()
}

async fn not_found(State(app): State<Arc<App>>) -> Response {
    app.pages.missing("no such page".into())
}

/// Runs a page's reading and rendering off the async threads: SQLite blocks.
async fn blocking(app: Arc<App>, page: impl FnOnce(&Pages) -> anyhow::Result<Response> + Send + 'static) -> Response {
    match tokio::task::spawn_blocking(move || page(&app.pages)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            tracing::error!(error = %format!("{e:#}"), "cannot read the history");
            (StatusCode::INTERNAL_SERVER_ERROR, format!("cannot read the history: {e:#}")).into_response()
        }
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("the page failed: {e}")).into_response(),
    }
}

fn time(ms: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_seconds(t)
        .to_string()
        .replace('T', " ")
        .replace('Z', " UTC")
}

fn status_word(s: Status) -> &'static str {
    s.as_str()
}

fn usd(x: f64) -> String {
    format!("${x:.4}")
}

fn percent(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

/// An assertion as a row of the overview.
#[derive(Serialize)]
struct Row<'a> {
    id: i64,
    name: &'a str,
    kind: &'a str,
    agent: Option<&'a str>,
    total: u64,
    pass: u64,
    soft: u64,
    fail: u64,
    pass_rate: String,
    cost: String,
    status: &'static str,
    score: String,
    latest: String,
    drift: bool,
    chart: String,
}

impl<'a> Row<'a> {
    fn of(s: &'a AssertionSummary) -> Row<'a> {
        Row {
            id: s.id,
            name: &s.name,
            kind: &s.kind,
            agent: s.agent.as_deref(),
            total: s.total,
            pass: s.pass,
            soft: s.soft,
            fail: s.fail,
            pass_rate: percent(s.pass_rate()),
            cost: usd(s.cost),
            status: status_word(s.latest_status),
            score: format!("{:.3}", s.latest_score),
            latest: time(s.latest_ms),
            drift: s.drifting(),
            chart: charts::sparkline(&s.days),
        }
    }
}

#[derive(Deserialize, Default)]
struct OverviewQuery {
    q: Option<String>,
    status: Option<String>,
    kind: Option<String>,
    sort: Option<String>,
    dir: Option<String>,
    /// Read leniently: a page that is not a number is the first.
    page: Option<String>,
}

/// A `page` parameter as a page number (1 when it is none).
fn page_number(page: Option<&str>) -> usize {
    page.and_then(|p| p.trim().parse().ok()).unwrap_or(1)
}

/// Sortable columns of the overview.
const SORTS: [&str; 6] = ["name", "pass_rate", "results", "latest", "cost", "drift"];
const STATUS_FILTERS: [&str; 5] = ["all", "failing", "pass", "soft_fail", "hard_fail"];

async fn overview(State(app): State<Arc<App>>, Query(q): Query<OverviewQuery>) -> Response {
    blocking(app, move |p| {
        let snap = p.snapshot()?;
        let search = q.q.unwrap_or_default().chars().take(MAX_SEARCH).collect::<String>();
        let needle = search.to_lowercase();
        let status = q
            .status
            .filter(|s| STATUS_FILTERS.contains(&s.as_str()))
            .unwrap_or_else(|| "all".into());
        let kind = q.kind.filter(|k| !k.is_empty()).map(|k| k.chars().take(64).collect::<String>());
        let sort = q.sort.filter(|s| SORTS.contains(&s.as_str())).unwrap_or_else(|| "name".into());
        let desc = q.dir.as_deref() == Some("desc");
        let mut kinds: Vec<&str> = snap.assertions.iter().map(|a| a.kind.as_str()).collect();
        kinds.sort_unstable();
        kinds.dedup();
        let mut shown: Vec<&AssertionSummary> = snap
            .assertions
            .iter()
            .filter(|a| {
                needle.is_empty()
                    || a.name.to_lowercase().contains(&needle)
                    || a.agent.as_deref().is_some_and(|g| g.to_lowercase().contains(&needle))
                    || a.fingerprint.starts_with(&needle)
            })
            .filter(|a| kind.as_deref().is_none_or(|k| a.kind == k))
            .filter(|a| match status.as_str() {
                "failing" => a.latest_status != Status::Pass,
                "all" => true,
                s => a.latest_status.as_str() == s,
            })
            .collect();
        shown.sort_by(|a, b| {
            let o = match sort.as_str() {
                "pass_rate" => a.pass_rate().total_cmp(&b.pass_rate()),
                "results" => a.total.cmp(&b.total),
                "latest" => a.latest_ms.cmp(&b.latest_ms),
                "cost" => a.cost.total_cmp(&b.cost),
                "drift" => {
                    (a.drift == attest_history::DriftStatus::DriftDetected).cmp(&(b.drift == attest_history::DriftStatus::DriftDetected))
                }
                _ => a.name.cmp(&b.name),
            };
            let o = o.then(a.name.cmp(&b.name)).then(a.id.cmp(&b.id));
            if desc {
                o.reverse()
            } else {
                o
            }
        });
        let pages = shown.len().div_ceil(PAGE_ROWS).max(1);
        let page = page_number(q.page.as_deref()).clamp(1, pages);
        let rows: Vec<Row> = shown
            .iter()
            .skip((page - 1) * PAGE_ROWS)
            .take(PAGE_ROWS)
            .map(|a| Row::of(a))
            .collect();
        let (pass, soft, fail) = snap
            .assertions
            .iter()
            .fold((0, 0, 0), |(p, s, f), a| (p + a.pass, s + a.soft, f + a.fail));
        let drifting = snap.assertions.iter().filter(|a| a.drifting()).count();
        Ok(p.render(
            "overview.html",
            context! {
                title => "Overview",
                file => &p.file,
                rows,
                matched => shown.len(),
                assertions => snap.assertions.len(),
                results => snap.results,
                pass, soft, fail,
                kept => snap.kept,
                runs => snap.runs.len(),
                drifting,
                cost => usd(snap.assertions.iter().map(|a| a.cost).sum()),
                first => snap.first_ms.map(time),
                last => snap.last_ms.map(time),
                q => search,
                status,
                kind,
                kinds,
                sort,
                dir => if desc { "desc" } else { "asc" },
                page,
                pages,
                window => p.window,
                sorts => SORTS,
                statuses => STATUS_FILTERS,
            },
        ))
    })
    .await
}

#[derive(Serialize)]
struct PointRow {
    at: String,
    status: &'static str,
    score: String,
    trace_id: String,
    run: Option<i64>,
}

async fn assertion(State(app): State<Arc<App>>, UrlPath(id): UrlPath<String>) -> Response {
    blocking(app, move |p| {
        let Ok(id) = id.parse::<i64>() else {
            return Ok(p.missing(format!("no assertion {}", clip(&id, 64))));
        };
        let snap = p.snapshot()?;
        let Some(summary) = snap.assertions.iter().find(|a| a.id == id).cloned() else {
            return Ok(p.missing(format!("no assertion {id} in this history")));
        };
        let page = p
            .reader
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .assertion(id, Some(summary.clone()), p.window)?;
        // Oldest first for the chart, each with the band the dynamic
        // threshold had before it: mean ± 2 standard deviations of the
        // `window` scores before.
        let oldest: Vec<&attest_history::read::Point> = page.points.iter().rev().collect();
        let mut scored = Vec::with_capacity(oldest.len());
        for (i, pt) in oldest.iter().enumerate() {
            let before: Vec<f64> = oldest[i.saturating_sub(p.window)..i].iter().map(|q| q.score).collect();
            let band = (before.len() >= 2).then(|| {
                let (mean, sd) = attest_history::mean_stddev(&before);
                (mean - 2.0 * sd, mean + 2.0 * sd)
            });
            scored.push(charts::Scored {
                score: pt.score,
                failed: pt.status != Status::Pass,
                band,
            });
        }
        let alerts: Vec<PointRow> = oldest
            .iter()
            .zip(&scored)
            .filter(|(_, s)| s.band.is_some_and(|(lo, _)| s.score < lo))
            .rev()
            .take(PAGE_ROWS)
            .map(|(pt, _)| point_row(pt))
            .collect();
        let bins = charts::bins(page.points.iter().map(|p| p.score));
        let recent: Vec<PointRow> = page.points.iter().take(PAGE_ROWS).map(point_row).collect();
        let failures: Vec<_> = page
            .failures
            .iter()
            .map(|f| {
                context! {
                    kept => f.kept,
                    at => time(f.at_ms),
                    trace_id => &f.trace_id,
                    status => status_word(f.status),
                    score => format!("{:.3}", f.score),
                    detail => &f.detail,
                    judge => f.detail.judge.as_ref().map(|j| serde_json::to_string_pretty(j).unwrap_or_default()),
                }
            })
            .collect();
        Ok(p.render(
            "assertion.html",
            context! {
                title => &summary.name,
                file => &p.file,
                a => Row::of(&summary),
                fingerprint => &summary.fingerprint,
                chart => charts::scores(&scored),
                histogram => charts::histogram(&bins),
                bins => bins,
                points => page.points.len(),
                recent,
                alerts,
                failures,
                drift => &page.drift,
                mean => format!("{:.3}", page.drift.mean),
                stddev => format!("{:.3}", page.drift.stddev),
                window => p.window,
            },
        ))
    })
    .await
}

fn point_row(p: &attest_history::read::Point) -> PointRow {
    PointRow {
        at: time(p.at_ms),
        status: status_word(p.status),
        score: format!("{:.3}", p.score),
        trace_id: p.trace_id.clone(),
        run: p.run,
    }
}

fn clip(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

async fn evaluation(State(app): State<Arc<App>>, UrlPath(id): UrlPath<String>) -> Response {
    blocking(app, move |p| {
        let Ok(id) = id.parse::<i64>() else {
            return Ok(p.missing(format!("no evaluation {}", clip(&id, 64))));
        };
        let (e, run) = {
            let reader = p.reader.lock().unwrap_or_else(|e| e.into_inner());
            let Some(e) = reader.evaluation(id)? else {
                return Ok(p.missing(format!(
                    "no kept evaluation {id}: the oldest kept evaluations make room for new ones (history_kept_evaluations, history_kept_mib)"
                )));
            };
            // Its run's name only: the whole history's sum is not needed here.
            let run = match e.run {
                Some(r) => reader.run(r)?.map(|(kind, label)| (r, kind, label)),
                None => None,
            };
            (e, run)
        };
        let pointed: Vec<Vec<usize>> = e
            .members
            .iter()
            .filter_map(|m| m.detail.as_ref()?.trace_node_path.as_deref())
            .map(attest_trace::trace::step_indexes)
            .filter(|p| !p.is_empty())
            .collect();
        // A trace the history did not keep may be in a --traces file.
        let from_file = match &e.trace {
            None if !p.traces.is_empty() => find_trace(&p.traces, &e.trace_id),
            _ => None,
        };
        let trace = e.trace.as_deref().or(from_file.as_deref()).map(|t| tree::build(t, &pointed));
        // What did not pass first, hard failures before soft ones.
        let mut order: Vec<&attest_history::read::Member> = e.members.iter().collect();
        order.sort_by_key(|m| std::cmp::Reverse(m.status));
        let members: Vec<_> = order
            .into_iter()
            .map(|m| {
                let path = m.detail.as_ref().and_then(|d| d.trace_node_path.clone());
                let steps = path.as_deref().map(attest_trace::trace::step_indexes).unwrap_or_default();
                context! {
                    assertion => m.assertion,
                    name => &m.name,
                    kind => &m.kind,
                    status => status_word(m.status),
                    score => format!("{:.3}", m.score),
                    cost => usd(m.cost),
                    detail => &m.detail,
                    anchor => (!steps.is_empty()).then(|| tree::anchor(&steps)),
                    judge => m.detail.as_ref().and_then(|d| d.judge.as_ref()).map(|j| serde_json::to_string_pretty(j).unwrap_or_default()),
                }
            })
            .collect();
        let failing = e.members.iter().filter(|m| m.status != Status::Pass).count();
        Ok(p.render(
            "evaluation.html",
            context! {
                title => format!("Evaluation of {}", clip(&e.trace_id, 80)),
                file => &p.file,
                kept => e.kept,
                trace_id => &e.trace_id,
                at => time(e.at_ms),
                run => run.map(|(id, kind, label)| context! { id, label, kind }),
                members,
                failing,
                trace_kept => e.trace.is_some() || from_file.is_some(),
                trace_from_file => from_file.is_some(),
                searched => !p.traces.is_empty(),
                trace_unreadable => matches!(trace, Some(None)),
                trace => trace.flatten(),
                max_nodes => tree::MAX_NODES,
                max_depth => tree::MAX_DEPTH,
                max_value => tree::MAX_VALUE_BYTES,
            },
        ))
    })
    .await
}

#[derive(Deserialize, Default)]
struct RunsQuery {
    page: Option<String>,
}

fn run_row(r: &attest_history::read::RunSummary) -> minijinja::Value {
    let total = r.pass + r.soft + r.fail;
    context! {
        id => r.id,
        kind => &r.kind,
        label => &r.label,
        started => time(r.started_ms),
        last => time(r.last_ms),
        pass => r.pass,
        soft => r.soft,
        fail => r.fail,
        total,
        pass_rate => percent(if total == 0 { 0.0 } else { r.pass as f64 / total as f64 }),
        cost => usd(r.cost),
    }
}

async fn runs(State(app): State<Arc<App>>, Query(q): Query<RunsQuery>) -> Response {
    blocking(app, move |p| {
        let snap = p.snapshot()?;
        let pages = snap.runs.len().div_ceil(PAGE_ROWS).max(1);
        let page = page_number(q.page.as_deref()).clamp(1, pages);
        let rows: Vec<_> = snap.runs.iter().skip((page - 1) * PAGE_ROWS).take(PAGE_ROWS).map(run_row).collect();
        // The two newest, compared, is what people ask first.
        let newest = snap.runs.first().map(|r| r.id);
        let previous = snap.runs.get(1).map(|r| r.id);
        Ok(p.render(
            "runs.html",
            context! { title => "Runs", file => &p.file, rows, page, pages, count => snap.runs.len(), newest, previous },
        ))
    })
    .await
}

#[derive(Deserialize, Default)]
struct CompareQuery {
    a: Option<String>,
    b: Option<String>,
}

async fn compare(State(app): State<Arc<App>>, Query(q): Query<CompareQuery>) -> Response {
    blocking(app, move |p| {
        let snap = p.snapshot()?;
        let find = |v: &Option<String>| {
            v.as_deref()
                .and_then(|s| s.trim().parse::<i64>().ok())
                .and_then(|id| snap.runs.iter().find(|r| r.id == id))
        };
        let (Some(a), Some(b)) = (find(&q.a), find(&q.b)) else {
            return Ok(p.missing(
                "two runs to compare: choose them on the Runs page (compare?a=RUN&b=RUN, with run numbers from that page)".into(),
            ));
        };
        let cmp = p.reader.lock().unwrap_or_else(|e| e.into_inner()).compare(a.id, b.id)?;
        let name = |fp: i64| {
            snap.assertions
                .iter()
                .find(|s| s.id == fp)
                .map_or_else(|| format!("assertion {fp}"), |s| s.name.clone())
        };
        let mut newly_failing = Vec::new();
        let mut fixed = Vec::new();
        let mut still_failing = Vec::new();
        let mut only_a = Vec::new();
        let mut only_b = Vec::new();
        let mut deltas = Vec::new();
        for (fp, x, y) in &cmp.rows {
            // Failing in a run: any of its results there did not pass.
            let failing = |r: &attest_history::read::InRun| r.non_passing > 0;
            let row = |kept: Option<i64>| {
                context! {
                    id => fp,
                    name => name(*fp),
                    a_status => x.and_then(|r| r.latest_status).map(status_word),
                    b_status => y.and_then(|r| r.latest_status).map(status_word),
                    a_mean => x.map(|r| format!("{:.3}", r.mean())),
                    b_mean => y.map(|r| format!("{:.3}", r.mean())),
                    a_failed => x.map(|r| format!("{} of {} not passing", r.non_passing, r.results)),
                    b_failed => y.map(|r| format!("{} of {} not passing", r.non_passing, r.results)),
                    delta => x.zip(*y).map(|(x, y)| format!("{:+.3}", y.mean() - x.mean())),
                    kept,
                }
            };
            match (x, y) {
                (Some(x), Some(y)) => {
                    match (failing(x), failing(y)) {
                        (false, true) => newly_failing.push(row(y.kept)),
                        (true, false) => fixed.push(row(x.kept)),
                        (true, true) => still_failing.push(row(y.kept)),
                        (false, false) => {}
                    }
                    let d = y.mean() - x.mean();
                    if d.abs() > 1e-9 {
                        deltas.push((d, row(y.kept.or(x.kept))));
                    }
                }
                (Some(x), None) => only_a.push(row(x.kept)),
                (None, Some(y)) => {
                    if failing(y) {
                        newly_failing.push(row(y.kept));
                    }
                    only_b.push(row(y.kept));
                }
                (None, None) => {}
            }
        }
        deltas.sort_by(|x, y| x.0.total_cmp(&y.0));
        let deltas: Vec<_> = deltas.into_iter().take(PAGE_ROWS).map(|(_, r)| r).collect();
        let cap = |mut v: Vec<minijinja::Value>| {
            let n = v.len();
            v.truncate(PAGE_ROWS);
            (v, n)
        };
        let (newly_failing, newly_failing_n) = cap(newly_failing);
        let (fixed, fixed_n) = cap(fixed);
        let (still_failing, still_failing_n) = cap(still_failing);
        let (only_a, only_a_n) = cap(only_a);
        let (only_b, only_b_n) = cap(only_b);
        Ok(p.render(
            "compare.html",
            context! {
                title => "Compare runs",
                file => &p.file,
                a => run_row(a),
                b => run_row(b),
                newly_failing, newly_failing_n,
                fixed, fixed_n,
                still_failing, still_failing_n,
                only_a, only_a_n,
                only_b, only_b_n,
                deltas,
                shown => PAGE_ROWS,
            },
        ))
    })
    .await
}
