//! A throwaway PostgreSQL server for a test, from Debian's `postgresql`
//! package: its own cluster in a temporary directory, on a free loopback
//! port, with trust authentication for the user `attest`, stopped (and its
//! files removed) when dropped.
//!
//! PostgreSQL refuses to run as root, so under root (CI) the cluster is
//! made and run as the package's `postgres` user.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A running cluster.
pub struct PostgresServer {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    as_postgres: bool,
}

/// Where Debian puts the server's programs: the newest version installed.
fn bin_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("ATTEST_TEST_PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("initdb").exists() && bin.join("pg_ctl").exists())
        .collect();
    versions.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    versions.pop()
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

impl PostgresServer {
    /// Starts a cluster, or returns `None` (skipping, or panicking when
    /// skips are refused) when PostgreSQL is not installed.
    pub fn start() -> Option<PostgresServer> {
        let Some(bin) = bin_dir() else {
            return crate::missing(
                "PostgreSQL is not installed",
                "apt-get install -y postgresql (scripts/test does this as root), or set ATTEST_TEST_PG_BIN to its bin directory",
            );
        };
        let dir = std::env::temp_dir().join(format!(
            "attest-pg-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let as_postgres = is_root();
        if as_postgres {
            let ok = Command::new("chown").args(["-R", "postgres:postgres"]).arg(&dir).status();
            assert!(ok.is_ok_and(|s| s.success()), "chown {} to postgres", dir.display());
        }
        let port = crate::free_port();
        let server = PostgresServer {
            bin,
            dir,
            port,
            as_postgres,
        };
        let data = server.data();
        server.run(
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "-A",
                "trust",
                "-U",
                "attest",
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ],
        );
        server.start_again();
        Some(server)
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// One of the server's programs, run as `postgres` under root.
    fn command(&self, program: &str) -> Command {
        let exe = self.bin.join(program);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(exe);
            c
        } else {
            Command::new(exe)
        }
    }

    /// Runs one of the server's programs; panics with its output when it
    /// fails.
    fn run(&self, program: &str, args: &[&str]) {
        let out = self
            .command(program)
            .args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
        assert!(
            out.status.success(),
            "{program} {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts the cluster (after [`PostgresServer::stop`]), waiting until
    /// it accepts connections.
    pub fn start_again(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
            self.port,
            self.dir.display()
        );
        let log = self.dir.join("server.log");
        self.run(
            "pg_ctl",
            &[
                "-D",
                self.data().to_str().unwrap(),
                "-l",
                log.to_str().unwrap(),
                "-o",
                &options,
                "-w",
                "-t",
                "60",
                "start",
            ],
        );
    }

    /// Stops the cluster at once, as a crash would (`-m immediate`).
    pub fn stop(&self) {
        self.run("pg_ctl", &["-D", self.data().to_str().unwrap(), "-m", "immediate", "-w", "stop"]);
    }

    /// A URL for the `postgres` database, as the user `attest`.
    pub fn url(&self) -> String {
        format!("postgres://attest@127.0.0.1:{}/postgres", self.port)
    }

    /// Creates a database and returns its URL.
    pub fn database(&self, name: &str) -> String {
        self.run("createdb", &["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "attest", name]);
        format!("postgres://attest@127.0.0.1:{}/{name}", self.port)
    }

    /// Runs SQL with `psql` and returns what it printed (unaligned, tuples
    /// only): for tests that read the store as a user would.
    pub fn psql(&self, database: &str, sql: &str) -> String {
        let out = Command::new(self.bin.join("psql"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "attest", "-d", database])
            .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .stdin(Stdio::null())
            .output()
            .expect("psql runs");
        assert!(out.status.success(), "psql {sql:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        let data = self.data();
        let _ = self
            .command("pg_ctl")
            .args(["-D", data.to_str().unwrap_or_default(), "-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
