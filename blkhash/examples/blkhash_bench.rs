//! Library benchmark, like the reference's blkhash-bench: feed a hasher for a
//! fixed time and print one line of JSON with the throughput.
//!
//! ```text
//! cargo run --release -p blkhash --example blkhash_bench -- \
//!     --input data|zero|hole --digest sha256 --threads N --seconds S \
//!     [--block-size 64k] [--read-size 1m] [--hole-size 16g] [--queue-depth N]
//! ```
//!
//! - `data`: non-zero buffers of `--read-size` bytes through the zero-copy
//!   path (`submit` + `reclaim`), a few buffers recycled;
//! - `zero`: buffers of zeros through `update` (the zero-detection path);
//! - `hole`: `update_zeros` of `--hole-size` bytes at a time (no reading,
//!   no block digests).
//!
//! The time includes `finalize`.

use blkhash::{Algorithm, Options, Pipeline};
use std::process::exit;
use std::time::{Duration, Instant};

const USAGE: &str = "usage: blkhash_bench [--input data|zero|hole] [--digest NAME] \
[--threads N] [--seconds S] [--block-size SIZE] [--read-size SIZE] [--hole-size SIZE] \
[--queue-depth N]";

#[derive(Clone, Copy, PartialEq)]
enum Input {
    Data,
    Zero,
    Hole,
}

impl Input {
    fn name(self) -> &'static str {
        match self {
            Input::Data => "data",
            Input::Zero => "zero",
            Input::Hole => "hole",
        }
    }
}

struct Args {
    input: Input,
    digest: Algorithm,
    threads: usize,
    seconds: f64,
    block_size: usize,
    read_size: usize,
    hole_size: u64,
    queue_depth: Option<usize>,
}

fn fail(msg: &str) -> ! {
    eprintln!("blkhash_bench: {msg}\n{USAGE}");
    exit(2);
}

/// A size with an optional suffix k, m, g or t (powers of 1024).
fn parse_size(s: &str) -> u64 {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let num: u64 = num
        .parse()
        .unwrap_or_else(|_| fail(&format!("invalid size '{s}'")));
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        "t" | "tib" => 40,
        _ => fail(&format!("invalid size suffix in '{s}'")),
    };
    num.checked_mul(1 << shift)
        .unwrap_or_else(|| fail(&format!("size '{s}' too large")))
}

fn parse_args() -> Args {
    let mut a = Args {
        input: Input::Data,
        digest: Algorithm::Sha256,
        threads: blkhash::default_threads(),
        seconds: 2.0,
        block_size: blkhash::DEFAULT_BLOCK_SIZE,
        read_size: 1 << 20,
        hole_size: 16 << 30,
        queue_depth: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        // Both "--name value" and "--name=value".
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        if name == "-h" || name == "--help" {
            println!("{USAGE}");
            exit(0);
        }
        let value = inline
            .or_else(|| args.next())
            .unwrap_or_else(|| fail(&format!("{name} needs a value")));
        match name.as_str() {
            "-i" | "--input" => {
                a.input = match value.as_str() {
                    "data" => Input::Data,
                    "zero" => Input::Zero,
                    "hole" => Input::Hole,
                    _ => fail(&format!("unknown input '{value}'")),
                }
            }
            "-d" | "--digest" => {
                a.digest = value
                    .parse()
                    .unwrap_or_else(|e: blkhash::UnknownAlgorithm| fail(&e.to_string()))
            }
            "-t" | "--threads" => {
                a.threads = value
                    .parse()
                    .unwrap_or_else(|_| fail(&format!("invalid threads '{value}'")))
            }
            "-T" | "--seconds" => {
                a.seconds = value
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s >= 0.0)
                    .unwrap_or_else(|| fail(&format!("invalid seconds '{value}'")))
            }
            "-b" | "--block-size" => a.block_size = parse_size(&value) as usize,
            "-r" | "--read-size" => a.read_size = parse_size(&value) as usize,
            "-z" | "--hole-size" => a.hole_size = parse_size(&value),
            "-q" | "--queue-depth" => {
                a.queue_depth = Some(
                    value
                        .parse()
                        .unwrap_or_else(|_| fail(&format!("invalid queue depth '{value}'"))),
                )
            }
            _ => fail(&format!("unknown option '{name}'")),
        }
    }
    if a.read_size == 0 {
        fail("read size must not be 0");
    }
    if a.hole_size == 0 {
        fail("hole size must not be 0");
    }
    a
}

fn main() {
    let a = parse_args();
    let mut opts = Options::new()
        .algorithm(a.digest)
        .block_size(a.block_size)
        .threads(a.threads);
    if let Some(q) = a.queue_depth {
        opts = opts.queue_depth(q);
    }
    let mut h: Pipeline = Pipeline::new(opts).unwrap_or_else(|e| fail(&e.to_string()));
    let budget = Duration::from_secs_f64(a.seconds);
    let mut bytes = 0u64;
    let start = Instant::now();
    match a.input {
        Input::Data => {
            // Non-zero, not constant: a cheap pattern, made once. Enough
            // buffers to keep every worker busy with one more being handed
            // over; submit waits when the pool is full.
            let nbufs = 2 * a.threads + 2;
            let pattern: Vec<u8> = (0..a.read_size)
                .map(|i| (i.wrapping_mul(31).wrapping_add(7) % 251) as u8 | 1)
                .collect();
            let mut free: Vec<Vec<u8>> = (0..nbufs).map(|_| pattern.clone()).collect();
            drop(pattern);
            while start.elapsed() < budget {
                let buf = match free.pop() {
                    Some(b) => b,
                    None => h.reclaim_wait().expect("no buffer in flight"),
                };
                h.submit(buf);
                bytes += a.read_size as u64;
                while let Some(b) = h.reclaim() {
                    free.push(b);
                }
            }
        }
        Input::Zero => {
            let zeros = vec![0u8; a.read_size];
            while start.elapsed() < budget {
                h.update(&zeros);
                bytes += a.read_size as u64;
            }
        }
        Input::Hole => {
            while start.elapsed() < budget {
                h.update_zeros(a.hole_size);
                bytes += a.hole_size;
            }
        }
    }
    let checksum = h.finalize().unwrap_or_else(|e| fail(&e.to_string()));
    let elapsed = start.elapsed().as_secs_f64();
    let throughput = bytes as f64 / elapsed;
    println!(
        "{{\"input\": \"{}\", \"digest\": \"{}\", \"threads\": {}, \"block-size\": {}, \
\"read-size\": {}, \"hole-size\": {}, \"seconds\": {:.3}, \"bytes\": {}, \
\"throughput\": {:.0}, \"gbs\": {:.3}, \"checksum\": \"{}\"}}",
        a.input.name(),
        a.digest.name(),
        a.threads,
        a.block_size,
        a.read_size,
        a.hole_size,
        elapsed,
        bytes,
        throughput,
        throughput / 1e9,
        checksum
    );
}
