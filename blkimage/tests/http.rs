//! The HTTP storage against testkit's HTTP server, through the library's
//! own API (the commands' tests are blksum's tests/http.rs).

use blkimage::{Input, OpenOptions, open};
use testkit::http::{Hostile, Misbehave};

/// Bytes of reads kept in flight by default for the URL of `server`.
fn in_flight(server: &Hostile) -> Option<usize> {
    match open(&server.url, &OpenOptions::default()).unwrap() {
        Input::Image(src) => src.bytes_in_flight(),
        Input::Stream(_) => panic!("{} opened as a stream", server.url),
    }
}

/// A server farther away gets more reads in flight (issue #60: at 10 ms a
/// reply, 16 MiB in flight took 2.18x the time of reading alone), as its
/// first reply's round trip says; none gets less than 16 MiB (one nearby:
/// as before, which a unit test holds, since a loaded machine may make
/// any server seem far) or more than 64 MiB.
#[test]
fn reads_in_flight_follow_the_round_trip() {
    let data = vec![0x5au8; 1 << 20];
    let near = Hostile::start(data.clone(), Misbehave::Nothing);
    let got = in_flight(&near).unwrap();
    assert!((16 << 20..=64 << 20).contains(&got), "{got} bytes nearby");
    let far = Hostile::start(data.clone(), Misbehave::Delay(12));
    let got = in_flight(&far).unwrap();
    assert!((36 << 20..=64 << 20).contains(&got), "{got} bytes at 12 ms");
    let farther = Hostile::start(data, Misbehave::Delay(100));
    assert_eq!(in_flight(&farther), Some(64 << 20));
}
