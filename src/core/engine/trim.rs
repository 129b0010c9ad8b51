//! Memory given back to the device: idle segments after an age (the trimmer's tick), and all
//! of them on `empty_cache`.

use super::*;

impl<B: Backend> Engine<B> {
    /// Gives back every segment of `device` with nothing allocated for at least `age` (the
    /// backend's clock) whose fences passed, and exported segments left empty while the backend
    /// was quiet: memory a program returned to CUDA goes back to the device in bounded time
    /// (contract 8), without waiting for the GPU. Nothing while the backend is quiet.
    pub fn trim(&mut self, device: u8, age: u64) {
        if self.backend.quiet() {
            return;
        }
        self.backend.poll(device, false);
        let now = self.backend.now();
        // A device that needed fresh memory less than `age` ago is in use: what went back
        // would be reserved again, and each release (`cuMemFree`) waits for the whole device,
        // a stall of the program's pipeline. Its idle segments go back once it has gone `age`
        // without needing more (contract 8).
        let busy = now.saturating_sub(self.reserved_at[device as usize]) < age;
        let old: Vec<(u64, bool)> = self
            .segments
            .range(..)
            .filter(|(_, s)| {
                s.device == device
                    && s.allocated_blocks == 0
                    && s.size > 0
                    && (s.exported
                        || (!busy && now.saturating_sub(s.idle_since) >= age)
                        || (self.policy.release_on_free && s.range == 0))
            })
            .map(|(&p, s)| (p, s.exported))
            .collect();
        for (base, exported) in old {
            if exported {
                self.release_segment(base);
                continue;
            }
            let seg = self.segments[&base];
            let blocks = self.segment_blocks(base);
            if !blocks.iter().all(|&i| self.fence_clear(i)) {
                continue;
            }
            if seg.range > 0 {
                self.shrink(base, 0);
            } else {
                self.release_segment(base);
            }
        }
    }

    /// Waits for the device and returns every idle segment to it (`torch.cuda.empty_cache()`).
    /// Nothing while the backend is quiet (a stream capture is under way: no wait, no free).
    pub fn empty_cache(&mut self, device: u8) {
        if self.backend.quiet() {
            return;
        }
        self.backend.synchronize(device);
        self.stats.synchronizations += 1;
        self.release_idle(device, 0);
    }
}
