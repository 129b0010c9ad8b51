//! Fences as events: a checkpoint's events made (ahead, on the helper thread, or now) and
//! queried until they pass, and the trace's note of each.

use super::*;

impl CudaBackend {
    /// Hands the pending checkpoint of `slot` to the helper thread (see [`super::sealer`]);
    /// false when there is no helper (then the caller makes it).
    pub(super) fn seal_ahead(&mut self, slot: u8) -> bool {
        if self.sealer.is_none() && !self.sealer_failed {
            self.sealer = Sealer::start();
            self.sealer_failed = self.sealer.is_none();
        }
        let Some(sealer) = &self.sealer else {
            return false;
        };
        let s = &mut self.slots[slot as usize];
        let keep = s.spare.len().saturating_sub(s.streams.len() + 1);
        let request = Request {
            slot,
            id: s.next_id,
            streams: s.streams.clone(),
            spare: s.spare.split_off(keep),
            untracked: s.untracked,
        };
        match sealer.send(request) {
            Ok(()) => {
                note_checkpoint(slot, s.next_id, false);
                s.next_id += 1;
                s.pending_used = false;
                self.in_flight = Some((slot, s.next_id - 1));
                self.unanswered += 1;
                true
            }
            Err(r) => {
                s.spare.extend(r.spare);
                false
            }
        }
    }

    /// Takes the helper's answer, if there is one in flight (`wait`: waiting for it): its
    /// checkpoint joins the others in id order, or, when a synchronization passed it already
    /// or a capture kept the helper from making it, its events go back to the spares (fences
    /// that name it are covered by the next checkpoint, made later under a higher id).
    pub(in crate::pool) fn take_answer(&mut self, wait: bool) {
        if self.unanswered == 0 {
            return;
        }
        // Only the checkpoint in flight is waited for; a late one is taken when it comes.
        let wait = wait && self.in_flight.is_some();
        let Some(a) = self.sealer.as_ref().and_then(|x| x.answer(wait)) else {
            if let (true, Some((flying, _))) = (wait, self.in_flight) {
                // The helper did not answer in time: that checkpoint is given up (its late
                // answer is still taken, and its events kept).
                self.in_flight = None;
                self.slots[flying as usize].pending_used = true;
            }
            return;
        };
        self.unanswered -= 1;
        if self.in_flight == Some((a.slot, a.id)) {
            self.in_flight = None;
        }
        let s = &mut self.slots[a.slot as usize];
        if a.id < s.forgot_below {
            // Made before a reset of its context: its events are no longer CUDA's.
            return;
        }
        s.spare.extend(a.spare);
        s.seal_ns = a.took_ns;
        match a.made {
            Some((events, broken)) if a.id > s.passed_id => {
                let at = s
                    .sealed
                    .iter()
                    .position(|cp| cp.id > a.id)
                    .unwrap_or(s.sealed.len());
                s.sealed.insert(
                    at,
                    Checkpoint {
                        id: a.id,
                        events,
                        broken,
                    },
                );
            }
            Some((events, _)) => s.spare.extend(events),
            // Not made: what it would have covered waits for the next one.
            None => s.pending_used = true,
        }
    }

    /// Passes the checkpoints whose events all completed, oldest first.
    pub(super) fn query(&mut self, slot: u8) {
        self.take_answer(false);
        let t0 = costs::start();
        let query = real::function::<of::CuEventQuery>();
        let before = self.slots[slot as usize].passed_id;
        let s = &mut self.slots[slot as usize];
        in_context(slot, || {
            while let Some(cp) = s.sealed.front() {
                if cp.broken {
                    break;
                }
                // Not ready (600): not passed yet. Any other error (an event that was
                // recorded into a capture answers 907 from then on) can never say: the
                // checkpoint is broken, and only a synchronization of the device passes it.
                let answer = cp.events.iter().find_map(|&ev| {
                    // SAFETY: an event this backend recorded.
                    let rc = query.map_or(ERROR_NOT_READY, |q| unsafe { q(ev) });
                    (rc != 0).then_some(rc)
                });
                if let Some(rc) = answer {
                    if rc != ERROR_NOT_READY
                        && let Some(cp) = s.sealed.front_mut()
                    {
                        cp.broken = true;
                    }
                    break;
                }
                let Some(cp) = s.sealed.pop_front() else {
                    break;
                };
                s.passed_id = s.passed_id.max(cp.id);
                note_checkpoint(slot, cp.id, true);
                s.spare.extend(cp.events);
            }
        });
        if self.slots[slot as usize].passed_id > before {
            self.passes += 1;
        }
        costs::end(Cost::Query, t0);
    }

    /// Context `slot` was reset: its events and streams are gone (nothing is destroyed or
    /// asked of them), the segments it was giving back and the pages it had mapped in the
    /// address ranges `gone` are CUDA's no more, and every fence made so far counts as passed.
    pub(in crate::pool) fn forget_slot(&mut self, slot: u8, gone: &[(u64, u64)]) {
        self.take_answer(true);
        let s = &mut self.slots[slot as usize];
        s.sealed.clear();
        s.spare.clear();
        s.streams.clear();
        s.untracked = false;
        s.pending_used = false;
        s.passed_id = s.next_id;
        s.next_id += 1;
        s.forgot_below = s.next_id;
        if self.in_flight.is_some_and(|(f, _)| f == slot) {
            self.in_flight = None;
        }
        self.released.retain(|&(s, _)| s != slot);
        self.pages
            .retain(|&p, _| !gone.iter().any(|&(b, n)| b <= p && p < b + n));
    }

    /// Every fence up to checkpoint `id` passed (the device was synchronized).
    pub(in crate::pool) fn passed_up_to(&mut self, slot: u8, id: u64) {
        let s = &mut self.slots[slot as usize];
        if id > s.passed_id {
            note_checkpoint(slot, id, true);
            self.passes += 1;
        }
        s.passed_id = s.passed_id.max(id);
        while s.sealed.front().is_some_and(|cp| cp.id <= id) {
            if let Some(cp) = s.sealed.pop_front() {
                s.spare.extend(cp.events);
            }
        }
    }
}

/// `CUDA_ERROR_NOT_READY`: an event's work has not finished yet.
pub(super) const ERROR_NOT_READY: i32 = 600;

/// The trace's `pool_checkpoint` record: checkpoint `id` of `slot` made, or passed.
pub(super) fn note_checkpoint(slot: u8, id: u64, passed: bool) {
    trace::record(trace::Event::pool_checkpoint(id, passed, device_of(slot)));
}
