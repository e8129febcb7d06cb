//! What a WASI plugin writes to stderr during one call: only its last bytes
//! are kept, and only to explain a call that traps. A Python plugin's
//! uncaught exception, or a JavaScript plugin's, is printed there just
//! before the trap that ends the call; without it the engine could only say
//! "unreachable instruction executed". Only the trap's explanation quotes
//! it (at most 600 characters), so a chatty plugin costs a little memory per
//! call and never floods the log.

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
pub struct StderrTail(Arc<Mutex<VecDeque<u8>>>);

impl StderrTail {
    fn push(&self, bytes: &[u8]) {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let bytes = &bytes[bytes.len().saturating_sub(KEPT_BYTES)..];
        let over = (kept.len() + bytes.len()).saturating_sub(KEPT_BYTES);
        kept.drain(..over);
        kept.extend(bytes);
    }

    /// The kept text, trimmed; `None` when nothing but whitespace was
    /// written. A cut through a character at the start is replaced.
    pub fn text(&self) -> Option<String> {
        let kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let (a, b) = kept.as_slices();
        let text = String::from_utf8_lossy(&[a, b].concat()).trim().to_owned();
        (!text.is_empty()).then_some(text)
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
        assert_eq!(tail.text(), None);
        tail.push(b"  \n");
        assert_eq!(tail.text(), None, "whitespace alone is nothing");
        tail.push(b"Traceback (most recent call last):\n");
        tail.push(&vec![b'.'; KEPT_BYTES]);
        tail.push(b"\nValueError: x\n");
        let text = tail.text().unwrap();
        assert!(text.ends_with("\nValueError: x") && !text.contains("Traceback"), "{text}");
        assert_eq!(text.len(), KEPT_BYTES - 1, "the kept bytes, trimmed of the final newline");
        // One write larger than the whole tail keeps its own end.
        tail.push(&[vec![b'a'; 3 * KEPT_BYTES], b"end".to_vec()].concat());
        assert!(tail.text().unwrap().ends_with("aend"));
        // A character cut at the start is replaced, not refused.
        let tail = StderrTail::default();
        tail.push(&"é".repeat(KEPT_BYTES).into_bytes());
        assert!(tail.text().unwrap().starts_with('\u{FFFD}') || tail.text().unwrap().starts_with('é'));
    }
}
