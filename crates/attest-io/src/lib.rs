//! Reading the files users hand the engine (traces, assertions, manifests,
//! label files, rules, plugin components) without ever holding more than a
//! cap in memory.
//!
//! A regular file reports its size, so one that is too large is refused
//! before a byte is read. A pipe, a FIFO or a device (`/dev/zero`) reports
//! none (a FIFO is opened without waiting for a writer, and reads as empty
//! when there is none), and a file may grow while it is read, so the read itself also
//! stops one byte past the cap: that byte is how "exactly at the cap" is
//! told from "over it". Size is judged before text, so a cap that happens to
//! cut a character in two is reported as the size it is, not as bad UTF-8.
//!
//! Callers turn a [`ReadError`] into their own domain's error, with the
//! file's role ("trace file", "labels file") and what to do about it.
//!
//! What comes back out of those files onto a terminal goes through
//! [`printable`].
//!
//! Text that is small enough may still parse into far more memory than its
//! size: [`json_containers`] counts a JSON text's objects and arrays first.

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::path::Path;

/// Why a capped read gave no contents.
#[derive(Debug)]
pub enum ReadError {
    /// The file could not be opened or read.
    Io(std::io::Error),
    /// The file holds more than `limit` bytes. `size` is its size when the
    /// file system reports one; a pipe or a device reports none.
    TooLarge { limit: u64, size: Option<u64> },
    /// The contents are not UTF-8 text; `line` (from 1) holds the first
    /// byte that is not.
    NotUtf8 { line: usize },
}

impl fmt::Display for ReadError {
    /// Reads on after the file's name: "`<path>` is larger than 16 MiB".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Io(e) => write!(f, "cannot be read: {e}"),
            ReadError::TooLarge { limit, size: Some(size) } => write!(f, "is {size} bytes; the limit is {}", Size(*limit)),
            ReadError::TooLarge { limit, size: None } => write!(f, "is larger than {}", Size(*limit)),
            ReadError::NotUtf8 { line } => write!(f, "is not UTF-8 text (the first bad byte is on line {line})"),
        }
    }
}

impl std::error::Error for ReadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReadError::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<std::io::Error> for ReadError {
    fn from(e: std::io::Error) -> ReadError {
        ReadError::Io(e)
    }
}

/// A byte count as people write limits: whole MiB or KiB when it is one.
pub struct Size(pub u64);

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            n if n >= 1 << 20 && n % (1 << 20) == 0 => write!(f, "{} MiB", n >> 20),
            n if n >= 1 << 10 && n % (1 << 10) == 0 => write!(f, "{} KiB", n >> 10),
            1 => f.write_str("1 byte"),
            n => write!(f, "{n} bytes"),
        }
    }
}

/// `s` with control characters other than newline and tab, and the Unicode
/// line and paragraph separators, written as `\u{1b}`-style escapes: text
/// from input (an agent's, a provider's, a trace's) shown on a terminal or in
/// a report must not move the cursor, clear the screen, retitle the window
/// or start a line of its own.
pub fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    let escaped = |c: char| (c.is_control() && c != '\n' && c != '\t') || matches!(c, '\u{2028}' | '\u{2029}');
    if !s.chars().any(escaped) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if escaped(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `s` as XML 1.0 can carry it: control characters other than tab, newline
/// and carriage return (an agent's ANSI colours, say) and the noncharacters
/// U+FFFE and U+FFFF are not allowed anywhere in a document, even escaped,
/// and become U+FFFD. Markup is left to the writer to escape.
pub fn xml_text(s: &str) -> std::borrow::Cow<'_, str> {
    let refused = |c: char| !matches!(c, '\t' | '\n' | '\r') && (c.is_control() || matches!(c, '\u{FFFE}' | '\u{FFFF}'));
    if !s.chars().any(refused) {
        return std::borrow::Cow::Borrowed(s);
    }
    std::borrow::Cow::Owned(s.chars().map(|c| if refused(c) { '\u{FFFD}' } else { c }).collect())
}

/// Lets a closed standard output end the process the way it ends other Unix
/// tools: quietly, by SIGPIPE. Rust ignores SIGPIPE, so writing to a closed
/// pipe is an error, and `println!`, or reporting that error on a stderr that
/// went to the same pipe, panics. For one-shot commands whose output may be
/// cut short (`| head`); servers keep the default, since what they write to
/// is a peer that may come and go.
pub fn end_on_closed_output() {
    #[cfg(unix)]
    // SAFETY: restoring a signal's default disposition, before any thread
    // that could be writing starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Opens `path` for reading without waiting: opening a named pipe blocks
/// until something opens it for writing, which may be never. Once open, the
/// file reads as usual (a pipe with no writer reads as empty).
fn open(path: &Path) -> std::io::Result<File> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        use std::os::unix::io::AsRawFd;
        let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
        // SAFETY: `file` owns the descriptor for the duration of both calls.
        unsafe {
            let flags = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
            if flags >= 0 {
                libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK);
            }
        }
        Ok(file)
    }
    #[cfg(not(unix))]
    File::open(path)
}

/// The bytes of `path`, when there are at most `limit` of them.
pub fn read_capped(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    let file = open(path)?;
    let size = file.metadata().ok().filter(|m| m.is_file()).map(|m| m.len());
    if let Some(size) = size.filter(|&size| size > limit) {
        return Err(ReadError::TooLarge { limit, size: Some(size) });
    }
    let bytes = read_bounded(file, size, limit)?;
    if bytes.len() as u64 > limit {
        return Err(ReadError::TooLarge { limit, size: None });
    }
    Ok(bytes)
}

/// Up to `limit + 1` bytes of `source`, whose size, when known, is `size`.
///
/// `read_to_end` doubles its buffer, so a source without a size (a pipe,
/// `/dev/zero`) could take twice the cap, and every smaller buffer it left
/// behind stays with the allocator. Here a source without a size gets the
/// whole cap reserved at once: address space only, since pages are only
/// taken as bytes arrive, so memory follows what was read.
fn read_bounded(source: impl Read, size: Option<u64>, limit: u64) -> std::io::Result<Vec<u8>> {
    let cap = usize::try_from(limit.saturating_add(1)).unwrap_or(usize::MAX);
    // The reported size is only a hint: the file may have changed since.
    let mut bytes = Vec::new();
    // Where address space is scarce (strict overcommit), grow as bytes come.
    let _ = bytes.try_reserve_exact(size.map_or(cap, |s| s.min(limit) as usize));
    let out_of_memory = |e| std::io::Error::new(std::io::ErrorKind::OutOfMemory, e);
    let mut source = source.take(cap as u64);
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        let n = match source.read(&mut chunk) {
            Ok(0) => {
                // A small input read from a pipe gives back the reservation.
                if bytes.len() < bytes.capacity() / 2 {
                    bytes.shrink_to_fit();
                }
                return Ok(bytes);
            }
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if bytes.capacity() - bytes.len() < n {
            let grown = bytes.capacity().saturating_mul(2).max(bytes.len() + n).min(cap);
            bytes.try_reserve_exact(grown - bytes.len()).map_err(out_of_memory)?;
        }
        bytes.extend_from_slice(&chunk[..n]);
    }
}

/// The UTF-8 text of `path`, when it is at most `limit` bytes.
pub fn read_capped_text(path: &Path, limit: u64) -> Result<String, ReadError> {
    utf8(read_capped(path, limit)?)
}

/// `bytes` as text, or the line of the first byte that is not UTF-8.
pub fn utf8(bytes: Vec<u8>) -> Result<String, ReadError> {
    String::from_utf8(bytes).map_err(|e| {
        let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        ReadError::NotUtf8 {
            line: 1 + valid.iter().filter(|&&b| b == b'\n').count(),
        }
    })
}

/// More than the allowed number of JSON objects and arrays.
#[derive(Debug, PartialEq, Eq)]
pub struct TooManyContainers;

/// Counts the objects and arrays in a JSON text, up to `max`, without
/// parsing it. Each parses to a map or a vector of tens to hundreds of bytes
/// (an empty object, two bytes of text, becomes a map node of some 600), so
/// the count bounds what parsing the text would hold. Brackets inside
/// strings are text, not containers; malformed text is counted as far as
/// it goes, and left to the parser to refuse.
pub fn json_containers(text: &[u8], max: u64) -> Result<u64, TooManyContainers> {
    let mut count = 0;
    let (mut in_string, mut escaped) = (false, false);
    for &b in text {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                count += 1;
                if count > max {
                    return Err(TooManyContainers);
                }
            }
            _ => {}
        }
    }
    Ok(count)
}

/// `t` as RFC 3339 in UTC with milliseconds (`2026-12-07T13:20:00.123Z`),
/// the form of every timestamp the engine writes (Attest protocol v1 §1.3):
/// logs, reports, results files.
pub fn rfc3339_millis(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// The current time as [`rfc3339_millis`] writes it.
pub fn now_rfc3339() -> String {
    rfc3339_millis(std::time::SystemTime::now())
}

/// A size as a user writes it on a command line: with its unit (16MiB,
/// 512KiB, 1GB: KiB and the like are 1024s, KB and the like 1000s), or a
/// bare number of `bare_unit` bytes each (the older flags' form: bytes for
/// some, MiB for others). `None`: neither; the caller says what it wants.
pub fn size_with_unit(s: &str, bare_unit: u64) -> Option<u64> {
    let t = s.trim();
    match t.parse::<u64>() {
        Ok(n) => Some(n.saturating_mul(bare_unit)),
        Err(_) => t.parse::<bytesize::ByteSize>().ok().map(|b| b.as_u64()),
    }
}

/// Why [`whole_seconds`] refused a duration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DurationProblem {
    /// Not a duration with its unit (the parser's reason).
    NotADuration(String),
    /// A duration, but not a whole number of seconds (`1500ms`).
    NotWhole,
}

/// A duration written with its unit (30s, 5m, 1day), in whole seconds.
pub fn whole_seconds(s: &str) -> Result<u64, DurationProblem> {
    let d = humantime::parse_duration(s.trim()).map_err(|e| DurationProblem::NotADuration(e.to_string()))?;
    if d.subsec_nanos() != 0 {
        return Err(DurationProblem::NotWhole);
    }
    Ok(d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_whole_seconds_read_as_flags_write_them() {
        assert_eq!(size_with_unit("16MiB", 1), Some(16 << 20));
        assert_eq!(size_with_unit(" 1GB ", 1), Some(1_000_000_000));
        assert_eq!(size_with_unit("256", 1 << 20), Some(256 << 20));
        assert_eq!(size_with_unit("-1", 1), None);
        assert_eq!(whole_seconds("5m"), Ok(300));
        assert_eq!(whole_seconds("1500ms"), Err(DurationProblem::NotWhole));
        assert!(matches!(whole_seconds("soon"), Err(DurationProblem::NotADuration(_))));
    }

    #[test]
    fn timestamps_are_rfc3339_utc_with_milliseconds() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_765_113_600_123);
        assert_eq!(super::rfc3339_millis(t), "2025-12-07T13:20:00.123Z");
    }

    #[test]
    fn a_source_without_a_size_never_takes_more_than_the_cap() {
        let limit = 3 << 20;
        // Endless, like /dev/zero: one byte past the cap is read, no more.
        let bytes = read_bounded(std::io::repeat(0), None, limit).unwrap();
        assert_eq!(bytes.len() as u64, limit + 1);
        assert!(bytes.capacity() as u64 <= limit + 1, "{} bytes reserved", bytes.capacity());
        // Exactly at the cap, in odd-sized reads.
        let bytes = read_bounded(std::io::repeat(7).take(limit), None, limit).unwrap();
        assert_eq!(bytes.len() as u64, limit);
        assert!(bytes.capacity() as u64 <= limit + 1);
        assert!(bytes.iter().all(|&b| b == 7));
        // A small input keeps no more than it needs.
        let bytes = read_bounded(&b"{}"[..], None, limit).unwrap();
        assert_eq!((bytes.as_slice(), bytes.capacity()), (&b"{}"[..], 2));
        assert_eq!(read_bounded(std::io::empty(), None, limit).unwrap(), b"");
    }

    #[test]
    fn json_containers_counts_objects_and_arrays_outside_strings() {
        let text = br#"{"a": [{"b": "{[not these]}"}, "\"{"], "c": {}}"#;
        assert_eq!(json_containers(text, 10), Ok(4));
        assert_eq!(json_containers(text, 3), Err(TooManyContainers));
    }

    #[test]
    fn a_file_at_the_cap_is_read_and_one_past_it_is_refused_with_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path().join("at");
        std::fs::write(&at, "x".repeat(64)).unwrap();
        assert_eq!(read_capped(&at, 64).unwrap().len(), 64);
        assert_eq!(read_capped_text(&at, 64).unwrap(), "x".repeat(64));
        let over = dir.path().join("over");
        std::fs::write(&over, "x".repeat(65)).unwrap();
        let e = read_capped(&over, 64).unwrap_err();
        assert!(matches!(e, ReadError::TooLarge { limit: 64, size: Some(65) }), "{e:?}");
        assert_eq!(e.to_string(), "is 65 bytes; the limit is 64 bytes");
    }

    #[test]
    fn a_cap_that_cuts_a_character_is_a_size_error_not_bad_text() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("cut");
        std::fs::write(&p, "x".repeat(1023) + "é").unwrap();
        let e = read_capped_text(&p, 1024).unwrap_err();
        assert!(
            matches!(
                e,
                ReadError::TooLarge {
                    limit: 1024,
                    size: Some(1025)
                }
            ),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "is 1025 bytes; the limit is 1 KiB");
    }

    #[test]
    fn a_device_is_read_no_further_than_the_cap() {
        let e = read_capped(Path::new("/dev/zero"), 16 << 20).unwrap_err();
        assert!(matches!(e, ReadError::TooLarge { size: None, .. }), "{e:?}");
        assert_eq!(e.to_string(), "is larger than 16 MiB");
    }

    #[test]
    fn bad_text_names_the_line_and_a_missing_file_the_os_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("latin1");
        std::fs::write(&p, b"ok\nstill ok\ncaf\xe9\n").unwrap();
        let e = read_capped_text(&p, 1 << 20).unwrap_err();
        assert!(matches!(e, ReadError::NotUtf8 { line: 3 }), "{e:?}");
        let e = read_capped(&dir.path().join("missing"), 1).unwrap_err();
        assert!(
            matches!(&e, ReadError::Io(io) if io.kind() == std::io::ErrorKind::NotFound),
            "{e:?}"
        );
        assert!(e.to_string().starts_with("cannot be read: "), "{e}");
    }

    #[test]
    fn sizes_read_as_people_write_limits() {
        assert_eq!(Size(256 << 20).to_string(), "256 MiB");
        assert_eq!(Size(64 << 10).to_string(), "64 KiB");
        assert_eq!(Size(1000).to_string(), "1000 bytes");
        assert_eq!(Size(1).to_string(), "1 byte");
    }

    #[cfg(unix)]
    #[test]
    fn a_named_pipe_nobody_writes_to_reads_as_empty_instead_of_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: `c` is a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert_eq!(read_capped(&fifo, 10).unwrap(), b"");
    }

    #[test]
    fn control_characters_are_escaped_for_the_terminal() {
        assert_eq!(printable("a\u{1b}[2J\nb\u{7}"), "a\\u{1b}[2J\nb\\u{7}");
        assert_eq!(printable("\u{9b}31m"), "\\u{9b}31m", "C1 controls too");
        assert!(matches!(printable("plain\ttext"), std::borrow::Cow::Borrowed(_)));
        assert_eq!(
            printable("a\u{2028}b\u{2029}"),
            "a\\u{2028}b\\u{2029}",
            "line and paragraph separators"
        );
    }
}
