//! Texts per second of the local model at several batch sizes, in-process.
//!     cargo run --release -p attest-providers --example embed_rate -- MODEL_DIR
use attest_providers::local::LocalModel;
use std::time::Instant;

fn main() {
    let dir = std::env::args().nth(1).expect("model directory");
    let m = LocalModel::load(std::path::Path::new(&dir)).unwrap();
    let words: Vec<&str> =
        "the refund for order was processed and the customer will receive the money within five business days according to policy"
            .split(' ')
            .collect();
    let texts: Vec<String> = (0..128)
        .map(|i| {
            (0..60)
                .map(|k| format!("{}{}", words[(i + k) % words.len()], i % 7))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    m.embed(&refs[..4]).unwrap();
    for batch in [1usize, 4, 8, 16, 32, 64] {
        let t = Instant::now();
        for chunk in refs.chunks(batch) {
            m.embed(chunk).unwrap();
        }
        let s = t.elapsed().as_secs_f64();
        println!("batch {batch:3}: {:.1} texts/s", refs.len() as f64 / s);
    }
}
