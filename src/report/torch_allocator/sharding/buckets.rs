//! DDP's first buckets at more ranks, from a run at one. DDP makes its gradient buckets when
//! it wraps the model (`_ddp_init_helper`) and makes them again before the second step's
//! forward (`_pre_forward` rebuilds them in the order the gradients came). At two ranks or
//! more the first are let go just before the rebuilt ones are made; at one rank they live on
//! beside them into the second step's backward (read from traces of DDP on H200s: GPT-2's
//! 312 MiB bucket, NCCL and PyTorch's fake process group alike at two ranks). So a run at one
//! rank answered at more lets its first buckets go where the rebuilt ones begin; nothing else
//! moves.

use super::{Act, Put, Sharding};
use crate::report::kinds::Kind;
use crate::report::torch_allocator::{Ev, Input};

/// What a request of the run is to DDP's buckets: made as DDP wraps the model, made as it
/// rebuilds them, or neither.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bucket {
    Made,
    Rebuilt,
    Other,
}

impl Input {
    /// The run's first buckets let go before the rebuilt ones are made, where the run (at one
    /// rank) let them go after (`bucket` says what each request's stack is); `None` where
    /// nothing moves.
    pub fn buckets_let_go_first(&self, bucket: &dyn Fn(u64) -> Bucket) -> Option<Sharding> {
        let mut by_stack: crate::fasthash::FastMap<u64, Bucket> = Default::default();
        let mut role = |stack: u64| *by_stack.entry(stack).or_insert_with(|| bucket(stack));
        // The first buckets still live (by address: their index) at the first rebuilt one; those
        // let go before it stay where they are. A bucket is DDP's buffer, or the gradients'
        // storage (`gradient_as_bucket_view`); DDP's forward makes other requests too (the
        // inputs it moves).
        let mut first: crate::fasthash::FastMap<(u8, u64), usize> = Default::default();
        let mut rebuilt = None;
        for (i, e) in self.events.iter().enumerate() {
            match e.ev {
                Ev::Free | Ev::FreeRequested => {
                    first.remove(&(e.device, e.ptr));
                }
                Ev::Alloc
                    if !e.private && matches!(e.kind, Kind::Communication | Kind::Gradient) =>
                {
                    match role(e.stack) {
                        Bucket::Made => {
                            first.insert((e.device, e.ptr), i);
                        }
                        Bucket::Rebuilt => {
                            rebuilt = Some(i);
                            break;
                        }
                        Bucket::Other => {}
                    }
                }
                _ => {}
            }
        }
        let rebuilt = rebuilt?;
        if first.is_empty() {
            return None;
        }
        let mut act = vec![Act::Keep; self.events.len()];
        let mut moved: Vec<(usize, (u8, u64))> = first.iter().map(|(&k, &i)| (i, k)).collect();
        moved.sort_unstable();
        // Their frees after the rebuild are not made (until the address is made again); one
        // goes before it instead.
        for (j, e) in self.events.iter().enumerate().skip(rebuilt) {
            let key = (e.device, e.ptr);
            match e.ev {
                Ev::Free | Ev::FreeRequested if first.contains_key(&key) => act[j] = Act::Skip,
                Ev::Alloc => {
                    first.remove(&key);
                }
                _ => {}
            }
        }
        let inserts: Vec<(usize, Put)> = moved
            .iter()
            .map(|&(made, _)| {
                let e = &self.events[made];
                let put = Put {
                    free: true,
                    ptr: e.ptr,
                    size: 0,
                    stream: e.stream,
                    like: made,
                };
                (rebuilt, put)
            })
            .collect();
        let mut s = Sharding::of(
            "DDP's first buckets let go first",
            1,
            (String::new(), 0),
            (inserts.len(), 0),
            (0, 0),
        );
        s.act = act;
        s.inserts = inserts;
        Some(s)
    }
}
