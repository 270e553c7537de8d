//! Error messages.

/// An I/O error's reason without Rust's " (os error N)" suffix.
pub fn reason(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.rsplit_once(" (os error ") {
        Some((msg, _)) => msg.to_string(),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons() {
        let e = std::io::Error::from_raw_os_error(2);
        assert_eq!(reason(&e), "No such file or directory");
        assert_eq!(reason(&std::io::Error::other("bad")), "bad");
    }
}
