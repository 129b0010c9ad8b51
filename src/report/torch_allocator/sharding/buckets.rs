//! DDP's first buckets at more ranks, from a run at one. DDP makes its gradient buckets when
//! it wraps the model (`_ddp_init_helper`) and makes them again before the second step's
//! forward (`_pre_forward` rebuilds them in the order the gradients came). At one rank the
//! first live on beside the rebuilt ones into the second step's backward. At two ranks or more
//! they are let go before the rebuilt ones are made or after, as the collectives that used
//! them complete on NCCL's stream: traces of DDP on two H200s show both, from one job to the
//! next and from rank to rank of one job (GPT-2's 312 MiB bucket, a Llama's 332 MiB: peak
//! allocated the run at one rank's to within 0.05% where they are let go late, the first buckets'
//! bytes lower where they go first). So a run at one rank answers for the most a rank reaches,
//! and says the bytes a rank whose collectives complete first peaks lower by at most. A run at
//! two ranks or more did either as its rank did: its answer says which, and the bytes another
//! rank may peak lower (it held them) or higher (it let them go) by.

use super::super::{Ev, Input};
use crate::report::kinds::Kind;

/// What a request of the run is to DDP's buckets: made as DDP wraps the model, made as it
/// rebuilds them, or neither.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bucket {
    Made,
    Rebuilt,
    Other,
}

/// DDP's first buckets (made as it wraps the model): their bytes, and those still live when
/// the first rebuilt bucket is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FirstBuckets {
    pub made: u64,
    pub held: u64,
}

impl Input {
    /// The bytes of the first buckets made, and of those still live when the first rebuilt
    /// one is made (`bucket` says what each request's stack is); `None` where none is rebuilt
    /// or none was made.
    pub fn first_buckets(&self, bucket: &dyn Fn(u64) -> Bucket) -> Option<FirstBuckets> {
        let mut by_stack: crate::fasthash::FastMap<u64, Bucket> = Default::default();
        let mut role = |stack: u64| *by_stack.entry(stack).or_insert_with(|| bucket(stack));
        // The first buckets live (by address: their bytes). A bucket is DDP's buffer, or the
        // gradients' storage (`gradient_as_bucket_view`); DDP's forward makes other requests
        // too (the inputs it moves).
        let mut first: crate::fasthash::FastMap<(u8, u64), u64> = Default::default();
        let mut made = 0u64;
        for e in &self.events {
            match e.ev {
                Ev::Free | Ev::FreeRequested => {
                    first.remove(&(e.device, e.ptr));
                }
                Ev::Alloc
                    if !e.private && matches!(e.kind, Kind::Communication | Kind::Gradient) =>
                {
                    match role(e.stack) {
                        Bucket::Made => {
                            first.insert((e.device, e.ptr), e.size);
                            made = made.saturating_add(e.size);
                        }
                        Bucket::Rebuilt => {
                            let held = first.values().fold(0u64, |a, &b| a.saturating_add(b));
                            return (made > 0).then_some(FirstBuckets { made, held });
                        }
                        Bucket::Other => {}
                    }
                }
                _ => {}
            }
        }
        None
    }
}
