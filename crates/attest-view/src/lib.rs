//! `attest-engine view`: a local web viewer over the result history.
//!
//! It reads the history file read-only and serves pages rendered on the
//! server (minijinja templates, autoescaped; charts drawn by plotters as
//! SVG), with no script and nothing fetched from elsewhere: the stylesheet
//! is built into the binary. It listens on loopback unless told otherwise,
//! and anywhere else only with a token.
//!
//! - `pages.rs`: the pages and the queries behind them;
//! - `charts.rs`: the SVG charts;
//! - `tree.rs`: a kept trace as a bounded tree of steps;
//! - `import.rs`: results files and reports shown beside the history.

#![forbid(unsafe_code)]

mod charts;
mod import;
mod pages;
mod tree;

use anyhow::Context as _;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// `attest-engine view`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ViewArgs {
    /// The history file to read (default: the one the engine writes, from
    /// attest.toml's history_path or <cache_dir>/history.sqlite3).
    #[arg(long, value_name = "PATH")]
    pub history: Option<String>,
    /// Where to listen (IP:PORT). Loopback unless --bearer-token-env is given.
    #[arg(long, default_value = "127.0.0.1:8787")]
    pub addr: SocketAddr,
    /// Environment variable holding the token a browser must present
    /// (`?token=…` once, then a cookie) or a client sends as
    /// `Authorization: Bearer …`. Required to listen beyond loopback.
    #[arg(long = "bearer-token-env", value_name = "VAR")]
    pub bearer_token_env: Option<String>,
    /// A `--traces-out` file of `collect` (repeatable): a failing evaluation
    /// whose trace the history did not keep shows it from here.
    #[arg(long = "traces", value_name = "FILE")]
    pub traces: Vec<PathBuf>,
    /// A results file to show with the history (repeatable): `collect
    /// --results-jsonl` output, a session report (`--report json=…`) or an
    /// ECP report (`ecp run --json-out`). Read into a private copy; the
    /// history itself is never written.
    #[arg(long = "results", value_name = "FILE")]
    pub results: Vec<PathBuf>,
    /// Newest scores per assertion its drift status is judged over.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u16).range(2..=1000))]
    pub window: u16,
}

/// What every request shares.
pub(crate) struct App {
    pub(crate) pages: pages::Pages,
    token: Option<String>,
}

/// Runs the viewer until SIGINT or SIGTERM. `default_history` is the store
/// the engine's configuration names, used when `--history` is not given.
pub async fn run_view(args: ViewArgs, default_history: Option<attest_history::Location>) -> anyhow::Result<i32> {
    use attest_history::Location;
    let history = match args.history.as_deref() {
        Some(url) if Location::is_postgres_url(url) => Some(Location::Postgres(url.to_owned())),
        Some(path) => Some(Location::File(PathBuf::from(path))),
        // With results files, a default history that was never written is
        // no history.
        None if !args.results.is_empty() => default_history.filter(|h| h.file().is_none_or(|f| f.is_file())),
        None => Some(default_history.context(
            "no history to read: give --history PATH (or a postgres:// URL) or --results FILE, or set history_path (or cache_dir) in attest.toml",
        )?),
    };
    let token = match &args.bearer_token_env {
        Some(var) => Some(
            std::env::var(var)
                .ok()
                .filter(|t| !t.is_empty())
                .with_context(|| format!("--bearer-token-env {var}: the environment variable is not set or empty"))?,
        ),
        None => None,
    };
    if !args.addr.ip().is_loopback() && token.is_none() {
        anyhow::bail!(
            "--addr {} is not a loopback address: the viewer shows traces and results, so beyond this machine it needs a token; pass --bearer-token-env VAR with the token in VAR, or listen on 127.0.0.1",
            args.addr
        );
    }
    for t in &args.traces {
        if !t.is_file() {
            anyhow::bail!("--traces {}: not a file; give a file `collect --traces-out` wrote", t.display());
        }
    }
    for r in &args.results {
        if !r.is_file() {
            anyhow::bail!(
                "--results {}: not a file; give a collect --results-jsonl file, a --report json=… session report or an ecp run --json-out report",
                r.display()
            );
        }
    }
    // A PostgreSQL history and results files are read into a private copy,
    // removed at exit; a history file alone is read where it is.
    let (read, shown, _copy) = match (&history, args.results.is_empty()) {
        (Some(Location::File(file)), true) => (file.clone(), file.display().to_string(), None),
        (None, true) => unreachable!("a history is required without --results"),
        _ => {
            if let Some(Location::File(h)) = history.as_ref().filter(|h| h.file().is_some_and(|f| !f.is_file())) {
                anyhow::bail!("--history {}: not a history file", h.display());
            }
            let dir = tempfile::Builder::new().prefix("attest-view-").tempdir()?;
            let copy = dir.path().join("history.sqlite3");
            let (from, files, into) = (history.clone(), args.results.clone(), copy.clone());
            let imported = tokio::task::spawn_blocking(move || import::import(from.as_ref(), &files, &into)).await??;
            let shown = match &history {
                Some(Location::File(h)) if imported.files.is_empty() => h.display().to_string(),
                Some(Location::File(h)) => format!("{} with {}", h.display(), imported.files.join(", ")),
                _ => imported.files.join(", "),
            };
            tracing::info!(
                results = imported.results,
                "read {} results from {}",
                imported.results,
                imported.files.join(", ")
            );
            (copy, shown, Some(dir))
        }
    };
    let pages = pages::Pages::open(&read, usize::from(args.window), args.traces.clone())?;
    let app = Arc::new(App { pages, token });
    let router = pages::routes()
        .layer(axum::middleware::from_fn_with_state(app.clone(), guard))
        .with_state(app);
    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .with_context(|| format!("--addr {}: cannot listen there", args.addr))?;
    let local = listener.local_addr()?;
    // The one line a person (or a test) reads to find the page.
    // The address is a word of its own in the message too (a space after
    // it), for whoever reads the line as text rather than JSON.
    tracing::info!(target: attest_log::STARTED, url = %format!("http://{local}/"), "serving {shown} on http://{local}/ (read-only)");
    axum::serve(listener, router).with_graceful_shutdown(shutdown()).await?;
    Ok(0)
}

async fn shutdown() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

const COOKIE: &str = "attest_view_token";

/// Compares in time independent of where they differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Read-only, token-checked, with headers that keep the page to itself.
async fn guard(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    if req.method() != axum::http::Method::GET && req.method() != axum::http::Method::HEAD {
        return (
            StatusCode::METHOD_NOT_ALLOWED,
            [(header::ALLOW, "GET, HEAD")],
            "the viewer is read-only: only GET",
        )
            .into_response();
    }
    if let Some(token) = &app.token {
        let presented = |v: &str| same(v, token);
        let bearer = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(presented);
        let cookie = req
            .headers()
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|c| c.trim().strip_prefix(COOKIE)?.strip_prefix('='))
            .any(presented);
        let query = req
            .uri()
            .query()
            .into_iter()
            .flat_map(|q| q.split('&'))
            .filter_map(|kv| kv.strip_prefix("token="))
            .any(presented);
        if query {
            // Once from the link, then from the cookie: the token leaves the
            // address bar (and the history) at once.
            let path = req.uri().path().to_owned();
            let mut r = axum::response::Redirect::to(&path).into_response();
            if let Ok(v) = HeaderValue::from_str(&format!("{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/")) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            return r;
        }
        if !bearer && !cookie {
            return (
                StatusCode::UNAUTHORIZED,
                "this viewer needs its token: open the link with ?token=… once, or send Authorization: Bearer …",
            )
                .into_response();
        }
    }
    let mut r = next.run(req).await;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    r
}
