//! Who holds memory, by call site or range, as the reports' text lists them.

use crate::report::sites::Holder;
use crate::report::units::human_bytes;
use std::fmt::Write as _;

/// The first `n` holders as text, one line each: bytes, allocations, call site or range.
pub fn holders_text(holders: &[Holder], n: usize, indent: &str) -> String {
    let mut o = String::new();
    for h in holders.iter().take(n) {
        let _ = writeln!(
            o,
            "{indent}{:>12} in {:>6}  {}",
            human_bytes(h.bytes),
            h.allocations,
            h.label
        );
    }
    o
}

/// As [`holders_text`], and one more line when rows were left out: how many and what they hold,
/// and `--top` with the count that shows them all.
pub fn holders_text_all(holders: &[Holder], n: usize, indent: &str) -> String {
    let mut o = holders_text(holders, n, indent);
    if holders.len() > n {
        let rest = &holders[n..];
        let bytes = rest.iter().map(|h| h.bytes).fold(0, u64::saturating_add);
        let _ = writeln!(
            o,
            "{indent}... and {} more holding {} (--top {} shows every row)",
            rest.len(),
            human_bytes(bytes),
            holders.len()
        );
    }
    o
}
