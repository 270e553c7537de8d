//! A compressed stream's trailer: a JSON list with, for each data frame,
//! the compressed size of its lz4 frame (a number), or of each of its lz4
//! frames (`{"TOTAL": [SIZE, ...]}`, TOTAL their sum).
//!
//! Read into two flat lists whose room is taken, fallibly, once before
//! parsing (at most one size per number in the text, and at most `max` of
//! them), not into `serde_json::Value`s: a hostile trailer of 64 MiB of
//! `1,` made 32 million of those, about a gigabyte, each allocation one
//! that aborts when memory runs out.

use super::memory::reserve;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::fmt;
use std::io;

/// The compressed sizes of each data frame's lz4 frames.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Sizes {
    /// Every lz4 frame's, in order.
    sizes: Vec<u64>,
    /// Where each data frame's end in `sizes`.
    ends: Vec<usize>,
}

impl Sizes {
    /// Data frames listed.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// The sizes of data frame `i`'s lz4 frames.
    pub fn get(&self, i: usize) -> Option<&[u64]> {
        let end = *self.ends.get(i)?;
        let start = i.checked_sub(1).map_or(0, |p| self.ends[p]);
        Some(&self.sizes[start..end])
    }

    /// One more lz4 frame's size, in the data frame being read.
    fn size(&mut self, n: u64) -> Result<(), String> {
        // Within the room taken before (one per number of the text).
        if self.sizes.len() == self.sizes.capacity() {
            return Err("more sizes than numbers".into());
        }
        self.sizes.push(n);
        Ok(())
    }

    /// The end of a data frame's sizes: their sum, if it is one.
    fn end(&mut self) -> Option<u64> {
        let start = self.ends.last().copied().unwrap_or(0);
        let sum = self.sizes[start..]
            .iter()
            .try_fold(0u64, |a, &s| a.checked_add(s));
        // Within its room too: one end per number at most.
        (self.ends.len() < self.ends.capacity() && self.sizes.len() > start).then_some(())?;
        self.ends.push(self.sizes.len());
        sum
    }
}

/// The sizes `json` lists, at most `max` lz4 frames: an error says why
/// not (an [`io::ErrorKind::OutOfMemory`] one if the lists cannot be had).
pub fn parse(json: &[u8], max: usize) -> io::Result<Result<Sizes, String>> {
    // Only numbers, their keys, and JSON's punctuation: no escapes, so
    // that keys are read where they lie, not copied.
    if let Some(c) = json
        .iter()
        .find(|c| !b"0123456789[]{}:,\" \t\r\n".contains(c))
    {
        return Ok(Err(format!("'{}' in a list of sizes", c.escape_ascii())));
    }
    let numbers = json
        .windows(2)
        .filter(|w| !w[0].is_ascii_digit() && w[1].is_ascii_digit())
        .count()
        + json.first().is_some_and(u8::is_ascii_digit) as usize;
    if numbers > max {
        return Ok(Err(format!("more than {max} sizes")));
    }
    let mut s = Sizes::default();
    reserve(&mut s.sizes, numbers, "a compression trailer's sizes")?;
    reserve(&mut s.ends, numbers, "a compression trailer's sizes")?;
    let mut de = serde_json::Deserializer::from_slice(json);
    let parsed = de
        .deserialize_seq(List(&mut s))
        .and_then(|()| de.end())
        .map_err(|e| e.to_string());
    Ok(parsed.map(|()| s))
}

/// The list.
struct List<'a>(&'a mut Sizes);

impl<'de> Visitor<'de> for List<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON list")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0;
        while seq.next_element_seed(Entry(self.0, i))?.is_some() {
            i += 1;
        }
        Ok(())
    }
}

/// Entry `.1` of the list: a size, or `{"TOTAL": [SIZE, ...]}`.
struct Entry<'a>(&'a mut Sizes, usize);

impl<'de> DeserializeSeed<'de> for Entry<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Entry<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "entry {} to be a size or {{TOTAL: [SIZES]}}", self.1)
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<(), E> {
        self.0.size(n).map_err(E::custom)?;
        self.0
            .end()
            .map(|_| ())
            .ok_or_else(|| E::custom("too many sizes"))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let i = self.1;
        let err = |why: String| de::Error::custom(format!("entry {i}: {why}"));
        let Some(total) = map.next_key::<&str>()? else {
            return Err(err("lists no sizes".into()));
        };
        let total: u64 = total
            .parse()
            .map_err(|_| err(format!("'{total}' is not a size")))?;
        map.next_value_seed(Frames(&mut *self.0))?;
        if map.next_key::<IgnoredAny>()?.is_some() {
            return Err(err("more than one TOTAL".into()));
        }
        match self.0.end() {
            Some(sum) if sum == total => Ok(()),
            _ => Err(err(format!("its sizes do not add up to {total}"))),
        }
    }
}

/// The sizes of one data frame's lz4 frames.
struct Frames<'a>(&'a mut Sizes);

impl<'de> DeserializeSeed<'de> for Frames<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Frames<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of sizes")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(n) = seq.next_element::<u64>()? {
            self.0.size(n).map_err(de::Error::custom)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(json: &str) -> Result<Vec<Vec<u64>>, String> {
        let s = parse(json.as_bytes(), 100).unwrap()?;
        Ok((0..s.len()).map(|i| s.get(i).unwrap().to_vec()).collect())
    }

    #[test]
    fn numbers_and_totals() {
        assert_eq!(
            sizes(r#"[312, {"920": [312, 304, 304]}, 7]"#).unwrap(),
            [vec![312], vec![312, 304, 304], vec![7]]
        );
        assert_eq!(sizes("[]").unwrap(), Vec::<Vec<u64>>::new());
        for (bad, want) in [
            (
                r#"[{"919": [312, 304, 304]}]"#,
                "entry 0: its sizes do not add up to 919",
            ),
            (r#"[1, {"0": []}]"#, "entry 1: its sizes do not add up to 0"),
            (r#"[1, {"x": [1]}]"#, "'x' in a list"),
            (r#"[1, {}]"#, "entry 1: lists no sizes"),
            (r#"[{"1": [1], "2": [2]}]"#, "more than one TOTAL"),
            ("[1, -2]", "'-' in a list"),
            ("[1, 2.5]", "'.' in a list"),
            (r#"[1, "2"]"#, "entry 1 to be a size"),
            ("[1, [2]]", "entry 1 to be a size"),
            ("{}", "a JSON list"),
            ("[1] 2", "trailing characters"),
            ("[1, 99999999999999999999]", ""),
        ] {
            let e = sizes(bad).unwrap_err();
            assert!(e.contains(want), "{bad}: {e}");
        }
        let many = format!("[{}1]", "1, ".repeat(100));
        assert_eq!(sizes(&many).unwrap_err(), "more than 100 sizes");
    }
}
