//! SQLite files the engine shares with other engine processes (result
//! history, provider cache): one way to open them.

use rusqlite::Connection;
use std::path::Path;
use std::time::Duration;

/// Opens `path` in WAL mode with a busy timeout. WAL lets several engine
/// processes share the file; NORMAL sync is safe under WAL (a crash loses
/// at most the last transactions, never the file).
pub fn open_shared(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    Ok(conn)
}
