//! SQLite files the engine shares with other engine processes (result
//! history, provider cache): one way to open them.

#![forbid(unsafe_code)]

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
    // A device, a pipe or a directory holds no database: SQLite would fail
    // on it, but only after creating its journal beside it (`/dev/null` as
    // the path: `/dev/null-journal`).
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
            Some(format!(
                "{} is not a regular file: give the path of a database file, or of one to create",
                path.display()
            )),
        ));
    }
    let conn = Connection::open(path)?;
    conn.busy_timeout(busy)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_regular_file_or_a_new_one_is_opened() {
        let e = open_shared(Path::new("/dev/null")).unwrap_err().to_string();
        assert!(e.contains("/dev/null is not a regular file"), "{e}");
        assert!(!Path::new("/dev/null-journal").exists());
        let dir = tempfile::tempdir().unwrap();
        assert!(open_shared(dir.path()).is_err(), "a directory");
        assert!(open_shared(&dir.path().join("new.sqlite3")).is_ok());
    }
}
