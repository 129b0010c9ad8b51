//! What decoding counted: records committed, torn, lost, missing, summed; and where it
//! stopped early.

/// Where decoding stopped early, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    pub offset: u64,
    pub index: u64,
    pub reason: String,
    /// Claimed slots after the damage that were not decoded.
    pub skipped: u64,
}

/// Counts kept while decoding.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DecodeStats {
    pub committed: u64,
    /// Records a writer began and never committed (the process died in between).
    pub torn: u64,
    /// Slots claimed and never written: the rest of a thread's block when it stopped or the
    /// process died. Not records; nothing was lost in them.
    pub unused: u64,
    pub lost: u64,
    /// Claimed slots that lie beyond the end of the file (records, or unused block tails).
    pub truncated: u64,
    /// Ring records overwritten before a checkpoint summarized them (the summarizer fell
    /// behind the writers, or the process died before its first checkpoint).
    pub unsummarized: u64,
    /// Live allocations the checkpoint summed by call site (its slot had no room to list
    /// them), and their bytes: a later free of one is not matched.
    pub summed: u64,
    pub summed_bytes: u64,
    /// Definitions (strings, stacks, modules) the shim could not keep apart from the ring.
    pub definitions_dropped: u64,
    /// Ring records the summarizer read only after it had passed their slot (a writer held up
    /// between claiming the slot and writing it): summarized, after records that followed them.
    pub summarized_late: u64,
    pub damage: Option<Damage>,
}

impl DecodeStats {
    /// What of the program's records the trace is missing, in words, when anything is: lost
    /// to a full ring, torn by a crash, past the end of a cut file, after damage.
    pub fn cut(&self) -> Option<String> {
        let mut parts = Vec::new();
        if self.lost > 0 {
            parts.push(format!(
                "{} records lost (the trace reached trace_max)",
                self.lost
            ));
        }
        if self.torn > 0 {
            parts.push(format!(
                "{} records torn (begun, never finished)",
                self.torn
            ));
        }
        if self.truncated > 0 {
            parts.push(format!(
                "{} records missing past the end of the file (it was cut short)",
                self.truncated
            ));
        }
        if self.unsummarized > 0 {
            parts.push(format!(
                "{} records left the ring before they were summarized",
                self.unsummarized
            ));
        }
        if self.summed > 0 {
            parts.push(format!(
                "{} allocations ({:.2} MiB) live at the checkpoint are counted by call site, not \
                 one by one (its slot was full; raise trace_max), so a later free of one is not \
                 matched",
                self.summed,
                self.summed_bytes as f64 / 1048576.0
            ));
        }
        if self.definitions_dropped > 0 {
            parts.push(format!(
                "{} stack or name definitions did not fit the shim's log of them",
                self.definitions_dropped
            ));
        }
        if let Some(d) = &self.damage {
            parts.push(format!(
                "damage at offset {} ({}), {} later records not read",
                d.offset, d.reason, d.skipped
            ));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }

    /// How far live figures (live at exit, at a boundary, a line's bytes) can be trusted when
    /// records are missing: `None` when they are exact. `unmatched_since` is the frees after
    /// the checkpoint that matched no allocation: with none, no summed allocation was freed.
    pub fn live_figures(&self, unmatched_since: u64) -> Option<&'static str> {
        if self.lost > 0 || self.truncated > 0 || self.unsummarized > 0 || self.damage.is_some() {
            Some(
                "records are missing, so allocations or frees among them are too: the program \
                 may have held more or less",
            )
        } else if self.summed > 0 && unmatched_since > 0 {
            Some("at most: frees of the allocations the checkpoint summed cannot be matched")
        } else {
            None
        }
    }
}
