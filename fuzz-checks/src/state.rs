//! blksync's side record (`MAP.dst`) from untrusted bytes, in this
//! version's format (a `blkjob::record::Record` bound to the state's map)
//! or the one earlier versions wrote (`blksync-dst 1`): a record that
//! parses must write back to text that parses equal, and find nothing
//! changed between itself and its copy; anything else is refused with a
//! reason. A panic or a hang is a bug. (The state itself is a block map:
//! the `blkmap` target fuzzes its parser.)

use blkjob::record::Record;

/// The target's check of one input.
pub fn check(data: &[u8]) {
    if let Ok(side) = Record::parse_side(data) {
        let again = Record::parse_side(side.to_text().as_bytes()).expect("a written record parses");
        assert_eq!(again, side);
        assert!(side.changed_since(&again, "the state").is_none());
    }
}
