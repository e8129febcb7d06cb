//! What a WASI plugin writes to stderr during one call: only its last bytes
//! are kept, and only to explain a call that traps. A Python plugin's
//! uncaught exception is printed there just before the trap that ends the
//! call; without it the engine could only say "unreachable instruction
//! executed". Only the trap's explanation quotes it (at most 600
//! characters), so a chatty plugin costs a little memory per call and never
//! floods the log.

use bytes::Bytes;
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// Bytes of stderr kept per call: the end of a Python traceback.
pub const KEPT_BYTES: usize = 2048;

/// The last [`KEPT_BYTES`] written to one call's stderr. Every write is
/// accepted, so a plugin never fails for writing too much.
#[derive(Clone, Default)]
pub struct StderrTail(Arc<Mutex<Kept>>);

#[derive(Default)]
struct Kept {
    bytes: VecDeque<u8>,
    /// Whether earlier bytes were let go.
    cut: bool,
}

/// What a call wrote to stderr, as far as it was kept.
pub struct Written {
    /// Trimmed; a character cut at the start is replaced.
    pub text: String,
    /// Whether what was written before `text` was let go.
    pub cut: bool,
}

impl StderrTail {
    fn push(&self, bytes: &[u8]) {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let skipped = bytes.len().saturating_sub(KEPT_BYTES);
        let bytes = &bytes[skipped..];
        let over = (kept.bytes.len() + bytes.len()).saturating_sub(KEPT_BYTES);
        kept.bytes.drain(..over);
        kept.bytes.extend(bytes);
        kept.cut |= skipped + over > 0;
    }

    /// What was written; `None` when nothing but whitespace was.
    pub fn written(&self) -> Option<Written> {
        let kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let (a, b) = kept.bytes.as_slices();
        let text = String::from_utf8_lossy(&[a, b].concat()).trim().to_owned();
        (!text.is_empty()).then_some(Written { text, cut: kept.cut })
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for StderrTail {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for StderrTail {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for StderrTail {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl IsTerminal for StderrTail {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for StderrTail {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::{StderrTail, KEPT_BYTES};

    #[test]
    fn keeps_the_last_bytes_of_every_write() {
        let tail = StderrTail::default();
        assert!(tail.written().is_none());
        tail.push(b"  \n");
        assert!(tail.written().is_none(), "whitespace alone is nothing");
        tail.push(b"Traceback (most recent call last):\n");
        let whole = tail.written().unwrap();
        assert_eq!((whole.text.as_str(), whole.cut), ("Traceback (most recent call last):", false));
        tail.push(&vec![b'.'; KEPT_BYTES]);
        tail.push(b"\nValueError: x\n");
        let end = tail.written().unwrap();
        assert!(
            end.text.ends_with("\nValueError: x") && !end.text.contains("Traceback"),
            "{}",
            end.text
        );
        assert!(end.cut, "the start was let go");
        assert_eq!(end.text.len(), KEPT_BYTES - 1, "the kept bytes, trimmed of the final newline");
        // One write larger than the whole tail keeps its own end.
        let tail = StderrTail::default();
        tail.push(&[vec![b'a'; 3 * KEPT_BYTES], b"end".to_vec()].concat());
        let end = tail.written().unwrap();
        assert!(end.cut && end.text.ends_with("aend") && end.text.len() == KEPT_BYTES);
        // A character cut at the start is replaced, not refused: an odd
        // number of bytes of two-byte characters starts inside one.
        let tail = StderrTail::default();
        tail.push("é".repeat(KEPT_BYTES).as_bytes());
        tail.push(b"x");
        let end = tail.written().unwrap().text;
        assert!(end.starts_with("\u{FFFD}é") && end.ends_with("éx"), "{end}");
    }
}
