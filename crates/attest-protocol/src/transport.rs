//! NDJSON framing on stdin/stdout.
//!
//! Input: [`LineReader`] returns one line at a time and never holds more than
//! `max_line` bytes: a longer line is consumed and discarded as it streams
//! past, keeping only a short prefix from which its id is recovered.
//!
//! Output: one writer thread owns stdout. Handlers send finished lines over
//! a bounded channel; when the reader of stdout stalls, the channel fills and
//! handlers wait, which in turn stops input from being read.

use crate::protocol::MAX_ID_BYTES;
use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::Deserializer as _;
use serde_json::value::RawValue;
use std::io::{self, Write};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::mpsc;

/// Bytes of an oversized line kept to recover its id and method.
const OVERSIZED_PREFIX: usize = 64 * 1024;
/// Finished response lines waiting for stdout.
const OUTPUT_QUEUE: usize = 256;

#[derive(Debug, PartialEq)]
pub enum Line {
    Complete(Vec<u8>),
    /// A line longer than the limit: its first bytes and its full length.
    Oversized {
        prefix: Vec<u8>,
        len: usize,
    },
}

pub struct LineReader<R> {
    inner: BufReader<R>,
    max_line: usize,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    pub fn new(input: R, max_line: usize) -> Self {
        LineReader {
            inner: BufReader::with_capacity(256 * 1024, input),
            max_line,
        }
    }

    /// The next line without its `\n` (and without a trailing `\r`), or
    /// `None` at end of input. Not cancel-safe: a cancelled call loses the
    /// partial line.
    pub async fn next(&mut self) -> io::Result<Option<Line>> {
        let mut buf = Vec::new();
        let mut len = 0usize;
        let mut oversized = false;
        loop {
            let chunk = self.inner.fill_buf().await?;
            if chunk.is_empty() {
                if len == 0 {
                    return Ok(None);
                }
                break;
            }
            let (take, done) = match memchr::memchr(b'\n', chunk) {
                Some(i) => (i, true),
                None => (chunk.len(), false),
            };
            len += take;
            if !oversized {
                if len > self.max_line {
                    oversized = true;
                    let room = OVERSIZED_PREFIX.saturating_sub(buf.len());
                    buf.extend_from_slice(&chunk[..take.min(room)]);
                    buf.truncate(OVERSIZED_PREFIX);
                    buf.shrink_to_fit();
                } else {
                    buf.extend_from_slice(&chunk[..take]);
                }
            }
            self.inner.consume(if done { take + 1 } else { take });
            if done {
                break;
            }
        }
        if oversized {
            return Ok(Some(Line::Oversized { prefix: buf, len }));
        }
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
        Ok(Some(Line::Complete(buf)))
    }
}

/// Best effort: the `id` and `method` of a request whose text is cut off.
/// Members that come before them must be complete in `prefix` to be skipped.
/// An id longer than [`MAX_ID_BYTES`] is left out, as a complete request's
/// would be refused: echoing it could make the answer longer than a line.
pub fn sniff_request(prefix: &[u8]) -> (Option<Box<RawValue>>, Option<String>) {
    type Found = (Option<Box<RawValue>>, Option<String>);
    // The visitor records into `found` as it goes: the overall parse always
    // fails on the cut-off text, but what was read before that still counts.
    struct Sniff<'f>(&'f mut Found);
    impl<'de> Visitor<'de> for Sniff<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a request object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<String>()? {
                match key.as_str() {
                    "id" => {
                        let id = map.next_value::<Box<RawValue>>()?;
                        self.0 .0 = Some(id).filter(|id| id.get().len() <= MAX_ID_BYTES);
                    }
                    "method" => self.0 .1 = Some(map.next_value::<String>()?),
                    _ => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                if self.0 .0.is_some() && self.0 .1.is_some() {
                    break;
                }
            }
            Ok(())
        }
    }
    let mut found: Found = (None, None);
    let mut de = serde_json::Deserializer::from_slice(prefix);
    let _ = de.deserialize_map(Sniff(&mut found));
    found
}

/// The line that closes the writer (no response is ever empty).
pub const CLOSE: Vec<u8> = Vec::new();

/// Starts the stdout writer thread. Lines are written with a trailing `\n`;
/// the output is flushed whenever the queue runs empty.
///
/// The writer stops when every sender is gone, or at [`CLOSE`]: requests
/// abandoned at the end of a drain still hold senders, and their late
/// answers must neither keep the process alive nor follow the last line.
pub fn spawn_writer<W: Write + Send + 'static>(output: W) -> (mpsc::Sender<Vec<u8>>, std::thread::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(OUTPUT_QUEUE);
    let handle = std::thread::Builder::new()
        .name("attest-stdout".into())
        .spawn(move || {
            let mut out = io::BufWriter::with_capacity(256 * 1024, output);
            while let Some(line) = rx.blocking_recv() {
                if line.is_empty() {
                    break;
                }
                if rx.is_empty() {
                    // Give producers a moment: on a busy machine more responses
                    // are usually about to arrive, and one write for several
                    // lines costs far less than a wake-up and a write per line.
                    std::thread::yield_now();
                }
                let mut next = Some(line);
                while let Some(line) = next.take_if(|l| !l.is_empty()) {
                    if out.write_all(&line).and_then(|_| out.write_all(b"\n")).is_err() {
                        tracing::error!("stdout is closed; responses can no longer be delivered");
                        return;
                    }
                    next = rx.try_recv().ok();
                }
                if next.is_some() {
                    // CLOSE came with the burst.
                    break;
                }
                if out.flush().is_err() {
                    tracing::error!("stdout is closed; responses can no longer be delivered");
                    return;
                }
            }
            // Dropping the receiver makes later sends fail: their requests were abandoned.
            let _ = out.flush();
        })
        .expect("spawning the stdout writer thread");
    (tx, handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `Write` whose bytes the test can read while the writer still runs.
    #[derive(Clone, Default)]
    struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn the_writer_stops_at_close_even_while_senders_remain() {
        let sink = Shared::default();
        let (tx, writer) = spawn_writer(sink.clone());
        let abandoned = tx.clone();
        tx.send(b"first".to_vec()).await.unwrap();
        tx.send(CLOSE).await.unwrap();
        tokio::task::spawn_blocking(move || writer.join().unwrap()).await.unwrap();
        assert!(abandoned.send(b"late".to_vec()).await.is_err(), "answers after CLOSE are refused");
        assert_eq!(sink.0.lock().unwrap().as_slice(), b"first\n");
    }

    async fn lines(input: &[u8], max: usize) -> Vec<Line> {
        let mut r = LineReader::new(input, max);
        let mut out = Vec::new();
        while let Some(l) = r.next().await.unwrap() {
            out.push(l);
        }
        out
    }

    #[tokio::test]
    async fn splits_lines_and_strips_cr() {
        let got = lines(b"a\r\nbb\n\nlast", 10).await;
        assert_eq!(
            got,
            vec![
                Line::Complete(b"a".to_vec()),
                Line::Complete(b"bb".to_vec()),
                Line::Complete(vec![]),
                Line::Complete(b"last".to_vec())
            ]
        );
    }

    #[tokio::test]
    async fn oversized_lines_are_skipped_with_their_length() {
        let mut input = vec![b'x'; 50];
        input.extend_from_slice(b"\nok\n");
        let got = lines(&input, 10).await;
        assert_eq!(got.len(), 2);
        assert!(matches!(&got[0], Line::Oversized { len: 50, prefix } if prefix.len() == 50));
        assert_eq!(got[1], Line::Complete(b"ok".to_vec()));
    }

    #[test]
    fn sniffs_id_and_method_from_a_cut_off_request() {
        let (id, m) = sniff_request(br#"{"jsonrpc":"2.0","id":"abc","method":"evaluate_batch","params":{"trace":{"x":"#);
        assert_eq!(id.unwrap().get(), "\"abc\"");
        assert_eq!(m.as_deref(), Some("evaluate_batch"));
        let (id, m) = sniff_request(br#"{"jsonrpc":"2.0","params":{"trace":{"x":"#);
        assert!(id.is_none() && m.is_none());
        assert!(sniff_request(b"garbage").0.is_none());
        // An id too long to echo is dropped; the method still counts.
        let long = format!(r#"{{"id":"{}","method":"evaluate_batch","params":{{"#, "x".repeat(MAX_ID_BYTES));
        let (id, m) = sniff_request(long.as_bytes());
        assert!(id.is_none());
        assert_eq!(m.as_deref(), Some("evaluate_batch"));
    }
}
