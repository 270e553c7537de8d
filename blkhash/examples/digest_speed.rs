//! Single-thread digest speed per algorithm and buffer size, like OpenZFS's
//! chksum_bench: `cargo run --release --example digest_speed [SECONDS]`.

use blkhash::{ALGORITHMS, Algorithm};
use std::time::{Duration, Instant};

fn speed(alg: Algorithm, size: usize, budget: Duration) -> f64 {
    let buf: Vec<u8> = (0..size).map(|i| (i * 31 + 7) as u8).collect();
    let mut out = vec![0u8; alg.output_len()];
    let start = Instant::now();
    let mut bytes = 0u64;
    while start.elapsed() < budget {
        for _ in 0..16 {
            alg.digest_into(&buf, &mut out);
        }
        bytes += 16 * size as u64;
    }
    bytes as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.2);
    let budget = Duration::from_secs_f64(secs);
    let sizes = [
        1 << 10,
        4 << 10,
        16 << 10,
        64 << 10,
        256 << 10,
        1 << 20,
        4 << 20,
    ];
    print!("{:<12}", "MB/s");
    for s in sizes {
        print!("{:>9}", format!("{}k", s >> 10));
    }
    println!();
    for &alg in ALGORITHMS.iter().filter(|a| **a != Algorithm::Null) {
        print!("{:<12}", alg.name());
        for s in sizes {
            print!("{:>9.0}", speed(alg, s, budget) / 1e6);
        }
        println!();
    }
}
