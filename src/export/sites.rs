//! Live bytes by call site at the end of a trace (what `gpushim diff` compares).

use crate::report::replay_each;
use crate::trace::reader::{ReadError, ReadOptions};
use std::collections::HashMap;
use std::path::Path;

/// The site labels of a trace's live allocations at its end (for `diff`).
pub fn live_by_site(
    path: &Path,
    opts: &ReadOptions,
) -> Result<(u64, HashMap<String, u64>), ReadError> {
    let (reader, rp) = replay_each(path, opts, |_, _, _, _| {})?;
    let (live, holders) = crate::report::sites::live_holders(&reader, &rp);
    Ok((live, by_label(&holders)))
}

/// Bytes by call site's label (sites whose labels are the same summed).
pub fn by_label(holders: &[crate::report::Holder]) -> HashMap<String, u64> {
    let mut by: HashMap<String, u64> = HashMap::new();
    for h in holders {
        let b = by.entry(h.label.clone()).or_default();
        *b = b.saturating_add(h.bytes);
    }
    by
}
