//! Single-thread digest speed per algorithm and buffer size, like OpenZFS's
//! chksum_bench: `cargo run --release --example digest_speed [SECONDS]
//! [--digest NAME]... [--size SIZE]...`. SECONDS is the time per cell
//! (default 0.2); each `--digest` limits the table to that digest (default:
//! all but null), each `--size` (in KiB, suffix k optional) to that buffer
//! size (default: 1k to 4096k). The row `sha256-many` is SHA-256 over 16
//! buffers at once (`Algorithm::digest_many`, the multi-buffer kernel the
//! block digests use).

use blkhash::{ALGORITHMS, Algorithm};
use std::time::{Duration, Instant};

const USAGE: &str = "usage: digest_speed [SECONDS] [--digest NAME]... [--size KIB]...";

/// Bytes per second digesting `size`-byte buffers 16 at a time, one by one
/// (`digest_into`) or as one batch (`digest_many`, what the workers call).
fn speed(alg: Algorithm, size: usize, budget: Duration, many: bool) -> f64 {
    let buf: Vec<u8> = (0..size).map(|i| (i * 31 + 7) as u8).collect();
    let msgs: Vec<&[u8]> = vec![&buf; 16];
    let mut out = vec![0u8; 16 * alg.output_len()];
    let start = Instant::now();
    let mut bytes = 0u64;
    while start.elapsed() < budget {
        if many {
            alg.digest_many(&msgs, &mut out);
        } else {
            for _ in 0..16 {
                alg.digest_into(&buf, &mut out[..alg.output_len()]);
            }
        }
        bytes += 16 * size as u64;
    }
    bytes as f64 / start.elapsed().as_secs_f64()
}

fn fail(msg: &str) -> ! {
    eprintln!("digest_speed: {msg}\n{USAGE}");
    std::process::exit(2);
}

fn main() {
    let mut secs = 0.2;
    let mut only: Vec<Algorithm> = Vec::new();
    let mut sizes: Vec<usize> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        // "--name value" or "--name=value"; anything else is SECONDS.
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        if !name.starts_with("--") {
            secs = arg
                .parse()
                .ok()
                .filter(|s: &f64| s.is_finite() && *s >= 0.0)
                .unwrap_or_else(|| fail(&format!("invalid seconds '{arg}'")));
            continue;
        }
        let value = inline
            .or_else(|| args.next())
            .unwrap_or_else(|| fail(&format!("{name} needs a value")));
        match name.as_str() {
            "--digest" => only.push(
                value
                    .parse()
                    .unwrap_or_else(|e: blkhash::UnknownAlgorithm| fail(&e.to_string())),
            ),
            "--size" => sizes.push(
                value
                    .trim_end_matches(['k', 'K'])
                    .parse::<usize>()
                    .ok()
                    .filter(|k| (1..=1 << 20).contains(k))
                    .unwrap_or_else(|| fail(&format!("invalid size '{value}'")))
                    << 10,
            ),
            _ => fail(&format!("unknown option '{name}'")),
        }
    }
    if sizes.is_empty() {
        sizes = vec![
            1 << 10,
            4 << 10,
            16 << 10,
            64 << 10,
            256 << 10,
            1 << 20,
            4 << 20,
        ];
    }
    let budget = Duration::from_secs_f64(secs);
    print!("{:<12}", "MB/s");
    for &s in &sizes {
        print!("{:>9}", format!("{}k", s >> 10));
    }
    println!();
    let algs = ALGORITHMS.iter().copied().filter(|a| {
        if only.is_empty() {
            *a != Algorithm::Null
        } else {
            only.contains(a)
        }
    });
    for alg in algs {
        print!("{:<12}", alg.name());
        for &s in &sizes {
            print!("{:>9.0}", speed(alg, s, budget, false) / 1e6);
        }
        println!();
        // The multi-buffer row: what the block digests really run at.
        if alg == Algorithm::Sha256 {
            print!("{:<12}", "sha256-many");
            for &s in &sizes {
                print!("{:>9.0}", speed(alg, s, budget, true) / 1e6);
            }
            println!();
        }
    }
}
