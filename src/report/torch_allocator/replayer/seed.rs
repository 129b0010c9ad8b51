//! Where a replay from a ring's checkpoint starts: the run's own cache as the checkpoint kept
//! it (the run itself, to the byte), or the tensors it kept live in a cache of their own
//! (another run: another setting or batch).

use super::Replayer;
use crate::report::torch_allocator::SeedTensor;

impl Replayer<'_> {
    /// Starts each device's model as another run (another setting, another batch) would stand
    /// when the ring began: the tensors the checkpoint kept live, each asked for again in the
    /// order they were made, from a cache that held nothing. The run's cache is its own: its
    /// segments were sized for its requests under its setting, and started from them, another
    /// setting's replay kept them beside its own (expandable segments through a 4 MiB ring 4%
    /// to 7% above the whole traces' at the run's own batch; afresh within 0.7%, docs/fit.md).
    /// What the earlier steps left cached beyond those tensors is not known; the ring's steps
    /// build it again.
    pub(super) fn seed_afresh(&mut self) -> Option<String> {
        let seed = &self.input.seed;
        for (&d, ds) in &seed.devices {
            let Some(m) = self.models.get_mut(&d) else {
                continue;
            };
            let mut tensors = ds.tensors.clone();
            tensors.sort_unstable_by_key(|t| (t.made_ns, t.ptr));
            for SeedTensor {
                ptr, size, stream, ..
            } in tensors
            {
                let stream = u64::from(stream);
                let got = m
                    .malloc(size, stream)
                    .or_else(|_| m.unlimited(|m| m.malloc(size, stream)));
                m.clear_hints();
                if let Ok(p) = got {
                    self.placed.insert((d, ptr), p);
                }
            }
        }
        Some(seed.inexact.clone().unwrap_or_else(|| {
            "another run starts from the tensors the checkpoint kept live, not from the run's \
             cache"
                .to_string()
        }))
    }

    /// Starts each device's model from PyTorch's cache as the ring's checkpoint kept it;
    /// returns why that is not the run's cache to the byte, if it is not.
    pub(super) fn seed(&mut self) -> Option<String> {
        let seed = &self.input.seed;
        let mut why = seed.inexact.clone();
        for (&d, ds) in &seed.devices {
            let Some(m) = self.models.get_mut(&d) else {
                continue;
            };
            let mut segments = ds.segments.clone();
            segments.sort_unstable();
            // Each tensor in the segment that holds it.
            let mut inside: Vec<Vec<(u64, u64)>> = vec![Vec::new(); segments.len()];
            let mut streams: Vec<Option<u16>> = vec![None; segments.len()];
            for &SeedTensor {
                ptr, size, stream, ..
            } in &ds.tensors
            {
                let i = segments.partition_point(|s| s.0 <= ptr);
                let holder = i
                    .checked_sub(1)
                    .filter(|&i| ptr < segments[i].0.saturating_add(segments[i].1));
                let Some(i) = holder else {
                    why.get_or_insert_with(|| {
                        format!("a live tensor at {ptr:#x} lies outside PyTorch's segments")
                    });
                    continue;
                };
                inside[i].push((ptr, size));
                if *streams[i].get_or_insert(stream) != stream {
                    why.get_or_insert_with(|| {
                        format!(
                            "the segment at {:#x} holds tensors of two streams",
                            segments[i].0
                        )
                    });
                }
            }
            for (i, &(base, size)) in segments.iter().enumerate() {
                let stream = u64::from(streams[i].unwrap_or(0));
                match m.seed_segment(base, size, stream, &inside[i]) {
                    Ok(()) => {
                        for &(p, _) in &inside[i] {
                            self.placed.insert((d, p), p);
                        }
                        let s = self.seeded.entry(d).or_default();
                        *s = s.saturating_add(size);
                    }
                    Err(e) => {
                        why.get_or_insert(e);
                    }
                }
            }
        }
        why
    }
}
