//! A hostile OpenAI-compatible provider on 127.0.0.1, so that layers 5 and 6,
//! `generate_user_message` and `cache_stats` run for real. Its replies are
//! part of the fuzzed input: scores out of range or as strings, replies
//! without JSON, explanations far over 64 KiB, server errors and slow answers.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

/// Starts the provider; returns its base URL (with `/v1`).
pub fn start(seed: u64) -> std::io::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}/v1", listener.local_addr()?);
    std::thread::spawn(move || {
        let mut rng = fastrand::Rng::with_seed(seed ^ 0x005e_ed0f_9a0d);
        for stream in listener.incoming().flatten() {
            let seed = rng.u64(..);
            std::thread::spawn(move || {
                let _ = serve(stream, fastrand::Rng::with_seed(seed));
            });
        }
    });
    Ok(url)
}

fn serve(stream: TcpStream, mut rng: fastrand::Rng) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line)? == 0 {
            return Ok(());
        }
        let mut length = 0usize;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header)? == 0 {
                return Ok(());
            }
            let h = header.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((name, value)) = h.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0u8; length.min(64 << 20)];
        reader.read_exact(&mut body)?;
        let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let (status, reply) = if request_line.contains("/embeddings") {
            embeddings(&request, &mut rng)
        } else {
            chat(&request, &mut rng)
        };
        if rng.u8(..50) == 0 {
            std::thread::sleep(Duration::from_millis(rng.u64(100..1500)));
        }
        let text = reply.to_string();
        let head = format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: keep-alive\r\n\r\n",
            text.len()
        );
        writer.write_all(head.as_bytes())?;
        writer.write_all(text.as_bytes())?;
        writer.flush()?;
    }
}

fn embeddings(request: &Value, rng: &mut fastrand::Rng) -> (&'static str, Value) {
    let inputs = match request.get("input") {
        Some(Value::Array(a)) => a.len(),
        _ => 1,
    };
    if rng.u8(..20) == 0 {
        return ("500 Internal Server Error", json!({"error": {"message": "boom"}}));
    }
    let data: Vec<Value> = (0..inputs)
        .map(|i| {
            let v: Vec<Value> = match rng.u8(..12) {
                0 => vec![json!(0.0); 8],
                1 => vec![json!(1.0); 3],
                2 => vec![json!(1e300); 8],
                3 => vec![json!(-1e300); 8],
                _ => (0..8).map(|_| json!(rng.f64() * 2.0 - 1.0)).collect(),
            };
            json!({"object": "embedding", "index": i, "embedding": v})
        })
        .collect();
    (
        "200 OK",
        json!({"object": "list", "data": data, "model": "fuzz", "usage": {"prompt_tokens": 5, "total_tokens": 5}}),
    )
}

fn chat(request: &Value, rng: &mut fastrand::Rng) -> (&'static str, Value) {
    // The verdict contract's nonce, from the engine's system message.
    let text = request.to_string();
    let start = text.find("<verdict-").map_or(0, |i| i + "<verdict-".len());
    let nonce: String = text[start..].chars().take_while(char::is_ascii_hexdigit).collect();
    let tagged = |body: String| format!("<verdict-{nonce}>{body}</verdict-{nonce}>");
    let content = match rng.u8(..16) {
        // Outside the contract: untagged, two verdicts, a guessed nonce.
        12 => json!({"score": 0.5}).to_string(),
        13 => format!(
            "{} {}",
            tagged(json!({"score": 0.1}).to_string()),
            tagged(json!({"score": 0.9}).to_string())
        ),
        14 => "<verdict-0000000000000000>{\"score\": 1}</verdict-0000000000000000>".to_string(),
        0 => tagged(json!({"score": 1.7, "explanation": "too high"}).to_string()),
        1 => tagged(json!({"score": -3, "explanation": "too low"}).to_string()),
        2 => tagged(r#"{"score": "0.9", "reason": "string score"}"#.to_string()),
        3 => tagged(r#"{"score": 1e308}"#.to_string()),
        4 => "no verdict here".to_string(),
        5 => tagged(json!({"score": 0.5, "explanation": "e".repeat(rng.usize(60_000..200_000))}).to_string()),
        6 => tagged(r#"prefix {"score": NaN} {"score": 0.4}"#.to_string()),
        7 => return ("429 Too Many Requests", json!({"error": {"message": "slow down"}})),
        8 => return ("200 OK", json!({"choices": []})),
        _ => tagged(json!({"score": rng.f64(), "explanation": "fine \u{202e}"}).to_string()),
    };
    (
        "200 OK",
        json!({"id": "x", "object": "chat.completion", "model": "fuzz",
               "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}),
    )
}
