//! A checkpoint's record of its image (`blkjob::record::Record::parse`)
//! from untrusted bytes, as a damaged or crafted checkpoint holds it: a
//! record that parses must write back to text that parses equal, and find
//! nothing changed between itself and its copy; anything else is refused
//! with a reason. A panic or a hang is a bug.

use blkjob::record::Record;

/// The target's check of one input.
pub fn check(data: &[u8]) {
    if let Ok(record) = Record::parse(data) {
        let again = Record::parse(record.to_text().as_bytes()).expect("a written record parses");
        assert_eq!(again, record);
        assert!(record.changed_since(&again, "the checkpoint").is_none());
        assert!(record.first_changed(&again).is_none());
    }
}
