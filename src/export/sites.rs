//! Live bytes by call site at the end of a trace (what `gpushim diff` compares).

use crate::report::{replay_each, site_label};
use crate::trace::reader::{ReadError, ReadOptions};
use std::collections::HashMap;
use std::path::Path;

/// The site labels of a trace's live allocations at its end (for `diff`).
pub fn live_by_site(
    path: &Path,
    opts: &ReadOptions,
) -> Result<(u64, HashMap<String, u64>), ReadError> {
    let (reader, rp) = replay_each(path, opts, |_, _, _, _| {})?;
    let mut by: HashMap<String, u64> = HashMap::new();
    for l in rp.all_live() {
        *by.entry(site_label(&reader, crate::report::site_key(l)))
            .or_default() += l.size;
    }
    Ok((rp.total_live(), by))
}
