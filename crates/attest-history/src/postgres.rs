//! The shared result store on PostgreSQL: what a fleet's sinks write and
//! every engine of it reads (`query_drift`, dynamic thresholds).
//!
//! One table, `attest_results`, a row per result, readable with plain SQL:
//! the trace, agent, assertion id (`rule/assertion` for continuous
//! evaluation), assertion type, status (`pass`, `soft_fail`, `hard_fail`),
//! score, the assertion's 16-byte fingerprint and when it was recorded.
//! Keyed results (production traces, which may be delivered more than once)
//! are unique on (trace id, assertion id): a second write of the same
//! result is a no-op, whichever process makes it. Test runs re-run traces
//! on purpose, so their rows are not keyed.
//!
//! Migrations are numbered in [`MIGRATIONS`] and recorded in
//! `attest_history_migrations`; processes starting together take an
//! advisory lock, so exactly one applies each. A database migrated by a
//! newer engine is refused rather than written in a layout it does not know.
//!
//! The writer thread drives a small Tokio runtime of its own: writes are
//! one transaction per look at the queue, as with SQLite; questions are
//! answered on other pooled connections (at most [`POOL_SIZE`] in all),
//! after the rows queued before them are committed.

use super::{now_ms, Backend, DriftReport, Fingerprint, HistoryConfig, Query, Rows, Subject};
use anyhow::Context as _;
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use std::sync::Arc;
use std::time::Duration;

/// How long opening the store may take: connecting and migrating.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one write (a transaction) or one question may take.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections one process holds at most: the writer's, and the rest for
/// questions answered while it writes.
pub(super) const POOL_SIZE: usize = 4;
/// Results per INSERT statement.
const ROWS_PER_INSERT: usize = 10_000;
/// Key of the advisory lock that serialises migrations across a fleet.
const MIGRATION_LOCK: i64 = 0x6174_7465_7374_6831; // "attesth1"

/// The layout, one step per version; a step is never edited once released.
const MIGRATIONS: &[(i32, &str)] = &[(
    1,
    "CREATE TABLE attest_results (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        recorded_at_ms BIGINT NOT NULL,
        trace_id TEXT NOT NULL,
        agent_id TEXT,
        assertion_id TEXT NOT NULL,
        assertion_type TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('pass', 'soft_fail', 'hard_fail')),
        score DOUBLE PRECISION NOT NULL,
        fingerprint BYTEA NOT NULL,
        keyed BOOLEAN NOT NULL
    );
    CREATE UNIQUE INDEX attest_results_once ON attest_results (trace_id, assertion_id) WHERE keyed;
    CREATE INDEX attest_results_by_fingerprint ON attest_results (fingerprint, id);
    CREATE INDEX attest_results_by_assertion ON attest_results (assertion_id, id);
    CREATE INDEX attest_results_by_time ON attest_results (recorded_at_ms);",
)];

/// `url` with its password replaced, for logs and errors.
pub(super) fn without_password(url: &str) -> String {
    // URL form: postgres://user:password@host/db
    if let Some(rest) = url.split_once("://").map(|(_, rest)| rest) {
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        if let Some(at) = rest[..authority_end].rfind('@') {
            if let Some(colon) = rest[..at].find(':') {
                let start = url.len() - rest.len();
                return format!("{}:***{}", &url[..start + colon], &url[start + at..]);
            }
        }
        return url.to_owned();
    }
    // Key-value form: host=… password=… dbname=…
    url.split_whitespace()
        .map(|kv| if kv.starts_with("password=") { "password=***" } else { kv })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The connection settings `url` gives (with [`CONNECT_TIMEOUT`] and
/// `application` unless it names its own), and the URL to show.
fn client_config(url: &str, application: &str) -> anyhow::Result<(String, tokio_postgres::Config)> {
    let shown = without_password(url);
    let mut pg: tokio_postgres::Config = url
        .parse()
        .map_err(|e| anyhow::anyhow!("history {shown} is not a PostgreSQL connection string: {e}"))?;
    if pg.get_connect_timeout().is_none() {
        pg.connect_timeout(CONNECT_TIMEOUT);
    }
    if pg.get_application_name().is_none() {
        pg.application_name(application);
    }
    Ok((shown, pg))
}

/// The writer thread's side of a PostgreSQL store.
pub(super) struct Writer {
    rt: tokio::runtime::Runtime,
    pool: Pool,
    config: HistoryConfig,
}

impl Writer {
    /// Connects, applies migrations and returns the writer, within
    /// [`CONNECT_TIMEOUT`].
    pub(super) fn connect(url: &str, config: HistoryConfig) -> anyhow::Result<Writer> {
        let (shown, pg) = client_config(url, "attest-engine")?;
        // A runtime of one worker: questions run there while this thread
        // writes.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("attest-history-pg")
            .enable_all()
            .build()?;
        let manager = Manager::from_config(
            pg,
            tls()?,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(STATEMENT_TIMEOUT))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .recycle_timeout(Some(CONNECT_TIMEOUT))
            .build()?;
        rt.block_on(async {
            let opened = tokio::time::timeout(CONNECT_TIMEOUT, async {
                let mut client = pool.get().await.map_err(|e| connect_error(&shown, e))?;
                migrate(&mut client).await
            })
            .await;
            match opened {
                Ok(result) => result,
                Err(_) => anyhow::bail!(
                    "history {shown}: no answer within {}s; check that PostgreSQL is running and reachable",
                    CONNECT_TIMEOUT.as_secs()
                ),
            }
        })?;
        Ok(Writer { rt, pool, config })
    }

    /// Enforces the age, result-count and byte limits across the whole
    /// store (every process of a fleet shares them).
    pub(super) fn prune(&mut self) {
        let cutoff = now_ms() - self.config.max_age.as_millis() as i64;
        let max_rows = i64::try_from(self.config.max_rows).unwrap_or(i64::MAX);
        let max_bytes = self.config.max_bytes;
        let pool = self.pool.clone();
        let result = self.rt.block_on(bounded(async move {
            let client = pool.get().await?;
            let mut deleted = client
                .execute("DELETE FROM attest_results WHERE recorded_at_ms < $1", &[&cutoff])
                .await?;
            // Rows and their own bytes (indexes come on top): a deleted
            // row's space is reused, not returned, so the table's size on
            // disk would never come back under the bound.
            let row = client
                .query_one(
                    "SELECT count(*), COALESCE(sum(pg_column_size(t.*)), 0)::BIGINT FROM attest_results t",
                    &[],
                )
                .await?;
            let (count, bytes): (i64, i64) = (row.get(0), row.get(1));
            let keep = if bytes as u64 > max_bytes && count > 0 {
                // The newest share that fills nine tenths of the bound.
                max_rows.min((count as u128 * max_bytes as u128 * 9 / 10 / bytes as u128) as i64)
            } else {
                max_rows
            };
            if count > keep {
                deleted += client
                    .execute(
                        "DELETE FROM attest_results WHERE id <= (SELECT id FROM attest_results ORDER BY id DESC OFFSET $1 LIMIT 1)",
                        &[&keep],
                    )
                    .await?;
            }
            Ok::<_, anyhow::Error>((deleted, count.min(keep)))
        }));
        match result {
            Ok((deleted, kept)) if deleted > 0 => {
                tracing::info!(deleted_rows = deleted, results_kept = kept, "history retention applied");
            }
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "cannot apply history retention"),
        }
    }
}

impl Backend for Writer {
    fn prune(&mut self) {
        Writer::prune(self)
    }

    fn write(&mut self, pending: &mut Vec<Rows>) -> Result<u64, String> {
        if pending.is_empty() {
            return Ok(0);
        }
        let batch = std::mem::take(pending);
        let pool = self.pool.clone();
        let result = self.rt.block_on(async move {
            let mut client = pool.get().await.map_err(|e| format!("{:#}", anyhow::Error::new(e)))?;
            match tokio::time::timeout(STATEMENT_TIMEOUT, insert(&mut client, &batch)).await {
                Ok(Ok(n)) => Ok(n),
                Ok(Err(e)) => {
                    // The connection may be broken or mid-transaction:
                    // closed rather than handed to the next write.
                    drop(Object::take(client));
                    Err(format!("{e:#}"))
                }
                Err(_) => {
                    drop(Object::take(client));
                    Err(format!("no commit within {}s", STATEMENT_TIMEOUT.as_secs()))
                }
            }
        });
        result.inspect_err(|e| tracing::error!(error = %e, "cannot write result history"))
    }

    fn answer(&mut self, query: Query) {
        let pool = self.pool.clone();
        self.rt.spawn(async move {
            match query {
                Query::Recent(fp, limit, reply) => {
                    let scores = bounded(async {
                        let client = pool.get().await?;
                        Ok(latest(&client, &fp, limit).await?.into_iter().map(|(score, _)| score).collect())
                    });
                    let _ = reply.send(scores.await);
                }
                Query::Drift(subject, window, reply) => {
                    let _ = reply.send(bounded(drift(pool, subject, window)).await);
                }
            }
        });
    }
}

/// `work`, given up after [`STATEMENT_TIMEOUT`].
async fn bounded<T>(work: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    match tokio::time::timeout(STATEMENT_TIMEOUT, work).await {
        Ok(result) => result,
        Err(_) => anyhow::bail!("the PostgreSQL history did not answer within {}s", STATEMENT_TIMEOUT.as_secs()),
    }
}

/// TLS as PostgreSQL's `sslmode` asks (`prefer` by default), with the
/// server's certificate checked against this machine's trusted roots.
/// The newest `limit` results of the store at `url`, oldest first, with how
/// many it holds: what the viewer copies into a private SQLite store to
/// show. Read-only: nothing is migrated or written.
///
/// The store keeps no runs, costs or explanations, so the rows carry none.
/// Each keeps its own time, and the stored fingerprint is kept as the spec
/// digest it is read under, so results of one fingerprint stay together
/// (the copy's fingerprints are derived from the stored ones, not equal).
pub fn newest_rows(url: &str, limit: u64) -> anyhow::Result<(Vec<Rows>, u64)> {
    let (shown, pg) = client_config(url, "attest-engine view")?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let (client, connection) = tokio::time::timeout(CONNECT_TIMEOUT, pg.connect(tls()?))
            .await
            .map_err(|_| anyhow::anyhow!("history {shown}: no answer within {}s; check that PostgreSQL is running and reachable", CONNECT_TIMEOUT.as_secs()))?
            .map_err(|e| anyhow::anyhow!("history {shown}: cannot connect: {e}"))?;
        tokio::spawn(connection);
        let read = async {
            client.batch_execute("SET TRANSACTION READ ONLY").await.ok();
            let version: Option<i32> = client
                .query_opt("SELECT max(version) FROM attest_history_migrations", &[])
                .await
                .map_err(|e| anyhow::anyhow!("history {shown} holds no attest history (no attest_history_migrations table: {e}); run collect or a worker sink with it first"))?
                .and_then(|r| r.get(0));
            let known = MIGRATIONS.last().map_or(0, |(v, _)| *v);
            if version.is_some_and(|v| v > known) {
                anyhow::bail!("history {shown} is at layout version {}, newer than this viewer's {known}: upgrade attest-engine", version.unwrap_or(0));
            }
            let total: i64 = client.query_one("SELECT count(*) FROM attest_results", &[]).await?.get(0);
            let rows = client
                .query(
                    "SELECT recorded_at_ms, trace_id, agent_id, assertion_id, assertion_type, status, score, fingerprint
                     FROM attest_results ORDER BY id DESC LIMIT $1",
                    &[&(limit.min(i64::MAX as u64) as i64)],
                )
                .await?;
            anyhow::Ok((rows, total.max(0) as u64))
        };
        let (rows, total) = tokio::time::timeout(STATEMENT_TIMEOUT * 4, read)
            .await
            .map_err(|_| anyhow::anyhow!("history {shown}: reading took longer than {}s", (STATEMENT_TIMEOUT * 4).as_secs()))??;
        // Oldest first; consecutive results of one trace, agent and time
        // were written together: one batch.
        let mut batches: Vec<Rows> = Vec::new();
        for r in rows.iter().rev() {
            let at: i64 = r.get(0);
            let trace_id: String = r.get(1);
            let agent_id: Option<String> = r.get(2);
            let status: String = r.get(5);
            let assertion_id: String = r.get(3);
            let fingerprint: Vec<u8> = r.get(7);
            let identity = <[u8; 16]>::try_from(fingerprint.as_slice()).map_or_else(|_| assertion_id.clone(), |fp| Fingerprint(fp).hex());
            let row = super::Row {
                assertion_id,
                spec: crate::SpecDigest::submitted(&identity),
                assertion_type: crate::assertion_type_name(r.get(4)),
                status: attest_trace::Status::parse(&status).unwrap_or(attest_trace::Status::HardFail),
                score: r.get(6),
                cost: 0.0,
            };
            match batches.last_mut() {
                Some(b) if b.trace_id == trace_id && b.agent_id == agent_id && b.recorded_at_ms == Some(at) => b.rows.push(row),
                _ => batches.push(Rows {
                    trace_id,
                    agent_id,
                    rows: vec![row],
                    keyed: false,
                    run: None,
                    kept: None,
                    recorded_at_ms: Some(at),
                }),
            }
        }
        Ok((batches, total))
    })
}

fn tls() -> anyhow::Result<tokio_postgres_rustls::MakeRustlsConnect> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(native.certs);
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

/// What to tell the user when the first connection fails.
fn connect_error(shown: &str, e: deadpool_postgres::PoolError) -> anyhow::Error {
    // With its causes: the pool's own message ("error creating a new
    // object") says nothing of what to fix.
    let full = format!("{:#}", anyhow::Error::new(e));
    let hint = if full.contains("certificate") || full.contains("UnknownIssuer") {
        "the server's TLS certificate is not trusted by this machine: add its CA to the system's trust store, or add sslmode=disable on a network you trust"
    } else if full.contains("password") || full.contains("authentication") {
        "check the user and password in the connection string"
    } else if full.contains("does not exist") {
        "create the database first (createdb), or name one that exists"
    } else {
        "check that PostgreSQL is running and reachable at that address"
    };
    anyhow::anyhow!("cannot connect to the history {shown}: {full}; {hint}")
}

/// Applies the migrations this database has not had, under the fleet-wide
/// lock.
async fn migrate(client: &mut Object) -> anyhow::Result<()> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS attest_history_migrations (
            version INTEGER PRIMARY KEY,
            applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )",
    )
    .await?;
    let current: Option<i32> = tx
        .query_one("SELECT max(version) FROM attest_history_migrations", &[])
        .await?
        .get(0);
    let current = current.unwrap_or(0);
    let known = MIGRATIONS.last().map_or(0, |(v, _)| *v);
    if current > known {
        anyhow::bail!(
            "the history database is at layout version {current}, newer than this engine's {known}: upgrade attest-engine, or point it at another database"
        );
    }
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > current) {
        tx.batch_execute(sql)
            .await
            .with_context(|| format!("history layout migration {version}"))?;
        tx.execute("INSERT INTO attest_history_migrations (version) VALUES ($1)", &[version])
            .await?;
        tracing::info!(version, "history layout migrated");
    }
    tx.commit().await?;
    Ok(())
}

/// PostgreSQL text cannot hold NUL: it is stored as U+FFFD.
fn text(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains('\0') {
        std::borrow::Cow::Owned(s.replace('\0', "\u{FFFD}"))
    } else {
        std::borrow::Cow::Borrowed(s)
    }
}

/// Inserts `batch` in one transaction; the results it wrote (a keyed result
/// already stored is not written again).
async fn insert(client: &mut Object, batch: &[Rows]) -> anyhow::Result<u64> {
    let at = now_ms();
    let tx = client.transaction().await?;
    let statement = tx
        .prepare_cached(
            "INSERT INTO attest_results
                (recorded_at_ms, trace_id, agent_id, assertion_id, assertion_type, status, score, fingerprint, keyed)
             SELECT u.at, u.trace_id, u.agent_id, u.assertion_id, u.assertion_type, u.status, u.score, u.fingerprint, u.keyed
             FROM UNNEST($1::INT8[], $2::TEXT[], $3::TEXT[], $4::TEXT[], $5::TEXT[], $6::TEXT[], $7::FLOAT8[], $8::BYTEA[], $9::BOOL[])
                WITH ORDINALITY AS u(at, trace_id, agent_id, assertion_id, assertion_type, status, score, fingerprint, keyed, n)
             ORDER BY u.n
             ON CONFLICT (trace_id, assertion_id) WHERE keyed DO NOTHING",
        )
        .await?;
    let rows = batch.iter().flat_map(|b| b.rows.iter().map(move |r| (b, r)));
    let total: usize = batch.iter().map(|b| b.rows.len()).sum();
    let mut written = 0;
    let mut rows = rows.peekable();
    while rows.peek().is_some() {
        let chunk: Vec<_> = rows.by_ref().take(ROWS_PER_INSERT.min(total.max(1))).collect();
        let trace_ids: Vec<_> = chunk.iter().map(|(b, _)| text(&b.trace_id)).collect();
        let agent_ids: Vec<_> = chunk.iter().map(|(b, _)| b.agent_id.as_deref().map(text)).collect();
        let assertion_ids: Vec<_> = chunk.iter().map(|(_, r)| text(&r.assertion_id)).collect();
        let kinds: Vec<&str> = chunk.iter().map(|(_, r)| r.assertion_type).collect();
        let statuses: Vec<&str> = chunk.iter().map(|(_, r)| r.status.as_str()).collect();
        let scores: Vec<f64> = chunk.iter().map(|(_, r)| r.score).collect();
        let fingerprints: Vec<Vec<u8>> = chunk
            .iter()
            .map(|(b, r)| Fingerprint::new(&r.spec, b.agent_id.as_deref()).0.to_vec())
            .collect();
        let keyed: Vec<bool> = chunk.iter().map(|(b, _)| b.keyed).collect();
        let times: Vec<i64> = chunk.iter().map(|(b, _)| b.recorded_at_ms.unwrap_or(at)).collect();
        let trace_ids: Vec<&str> = trace_ids.iter().map(|s| s.as_ref()).collect();
        let agent_ids: Vec<Option<&str>> = agent_ids.iter().map(|s| s.as_deref()).collect();
        let assertion_ids: Vec<&str> = assertion_ids.iter().map(|s| s.as_ref()).collect();
        written += tx
            .execute(
                &statement,
                &[
                    &times,
                    &trace_ids,
                    &agent_ids,
                    &assertion_ids,
                    &kinds,
                    &statuses,
                    &scores,
                    &fingerprints,
                    &keyed,
                ],
            )
            .await?;
    }
    tx.commit().await?;
    Ok(written)
}

/// The latest `limit` results of `fp`, newest first: (score, assertion id).
async fn latest(client: &Object, fp: &Fingerprint, limit: u64) -> anyhow::Result<Vec<(f64, String)>> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = client
        .query(
            "SELECT score, assertion_id FROM attest_results WHERE fingerprint = $1 ORDER BY id DESC LIMIT $2",
            &[&&fp.0[..], &limit],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

async fn drift(pool: Pool, subject: Subject, window: u64) -> anyhow::Result<DriftReport> {
    let client = pool.get().await?;
    let (assertion_id, fp, hits) = match subject {
        Subject::Fingerprint(fp) => {
            let hits = latest(&client, &fp, window).await?;
            (hits.first().map(|h| h.1.clone()).unwrap_or_default(), Some(fp), hits)
        }
        Subject::AssertionId(id) => {
            let row = client
                .query_opt(
                    "SELECT fingerprint FROM attest_results WHERE assertion_id = $1 ORDER BY id DESC LIMIT 1",
                    &[&text(&id).as_ref()],
                )
                .await?;
            let fp = row.and_then(|r| <[u8; 16]>::try_from(r.get::<_, &[u8]>(0)).ok()).map(Fingerprint);
            let hits = match &fp {
                Some(fp) => latest(&client, fp, window).await?,
                None => Vec::new(),
            };
            (id, fp, hits)
        }
    };
    let scores: Vec<f64> = hits.iter().map(|h| h.0).collect();
    Ok(DriftReport::from_window(assertion_id, fp, &scores, window))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        assert_eq!(
            without_password("postgres://attest:s3cret@db:5432/attest"),
            "postgres://attest:***@db:5432/attest"
        );
        assert_eq!(
            without_password("postgresql://u:p@ss@db/x?sslmode=require"),
            "postgresql://u:***@db/x?sslmode=require"
        );
        assert_eq!(without_password("postgres://attest@db/attest"), "postgres://attest@db/attest");
        assert_eq!(
            without_password("host=db password=s3cret dbname=x"),
            "host=db password=*** dbname=x"
        );
    }
}
