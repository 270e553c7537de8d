//! `delay-relay LISTEN_PORT TARGET_PORT DELAY_MS`: a TCP relay from
//! 127.0.0.1:LISTEN_PORT to 127.0.0.1:TARGET_PORT that holds every chunk
//! the server sends for DELAY_MS before passing it on (requests pass at
//! once): each reply arrives DELAY_MS late, as across a network with that
//! round trip, and bandwidth is not limited. The bench's HTTP case uses it
//! as the remote NBD case uses nbdkit's delay filter, which has no HTTP
//! counterpart. Written in Rust, not in the bench's Python: a relay in
//! asyncio moved about 100 MB/s on a busy 2-core machine, slower than the
//! clients it was to delay. Runs until killed.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, listen, target, ms] = args.as_slice() else {
        eprintln!("usage: delay-relay LISTEN_PORT TARGET_PORT DELAY_MS");
        std::process::exit(2);
    };
    let target: u16 = target.parse().expect("a port");
    let delay = Duration::from_secs_f64(ms.parse::<f64>().expect("milliseconds") / 1000.0);
    let listener = TcpListener::bind(("127.0.0.1", listen.parse::<u16>().expect("a port")))
        .expect("the port is free");
    for client in listener.incoming().flatten() {
        std::thread::spawn(move || {
            if let Ok(server) = TcpStream::connect(("127.0.0.1", target)) {
                relay(client, server, delay);
            }
        });
    }
}

/// Requests straight to the server; replies held `delay` each.
fn relay(client: TcpStream, server: TcpStream, delay: Duration) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut c_read, mut s_write) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut c_read, &mut s_write);
        let _ = s_write.shutdown(Shutdown::Write);
    });
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let mut c_write = client;
    let writer = std::thread::spawn(move || {
        for (due, chunk) in rx {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if c_write.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = c_write.shutdown(Shutdown::Both);
    });
    let mut s_read = server;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match s_read.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if tx
                    .send((Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
                {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.join();
}
