//! blksync's side record (`MAP.dst`) from untrusted bytes: a record that
//! parses must write back to the same text and parse again equal; anything
//! else is refused with a reason. A panic or a hang is a bug. (The state
//! itself is a block map: the `blkmap` target fuzzes its parser.)

#![no_main]

use blkjob::state::Side;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(side) = Side::parse(text) {
        let again = Side::parse(&side.to_text()).expect("a written record parses");
        assert_eq!(again, side);
        assert!(side.changed(&again).is_none());
    }
});
