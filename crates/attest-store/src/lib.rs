//! SQLite files the engine shares with other engine processes (result
//! history, provider cache): one way to open them.

use rusqlite::Connection;
use std::path::Path;
use std::time::Duration;

/// Opens `path` in WAL mode, waiting up to 5 s for another process's lock.
/// WAL lets several engine processes share the file; NORMAL sync is safe
/// under WAL (a crash loses at most the last transactions, never the file).
pub fn open_shared(path: &Path) -> rusqlite::Result<Connection> {
    open_shared_waiting(path, Duration::from_secs(5))
}

/// [`open_shared`], waiting at most `busy` for a lock, then and on every
/// later statement.
pub fn open_shared_waiting(path: &Path, busy: Duration) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(busy)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    Ok(conn)
}
