//! The lines `fit` prints for a job's what-ifs: `--shard` (FSDP2's or DeepSpeed's ZeRO's
//! sharding of a DDP run) and `--world-size` (one rank at another world size).

use crate::report::units::human_bytes;

/// What `--shard` changed, in one line.
pub(super) fn shard_line(o: &mut String, s: &crate::report::torch_allocator::Sharded) {
    use std::fmt::Write as _;
    if let Some(z) = &s.zero {
        return zero_line(o, s, z);
    }
    let kept = match s.way {
        "full" => "let go after each forward and gathered again for its backward",
        _ => "kept from its forward to its backward",
    };
    let buckets = dropped(s.dropped_bytes);
    // The class is an identifier (the frames' `CLASS.forward`); escaped all the same.
    let _ = writeln!(
        o,
        "one rank with the model sharded over {} ranks as FSDP2 shards it (--shard {}: \
         fully_shard on each {} block, {} a step, and on the model): {} requests of parameters, \
         optimizer state and the optimizer's temporaries ({} over the run) cut to 1/{}; {}a \
         block's parameters ({}) and the rest ({}) gathered whole for their forward, {}, each \
         with an all-gather output beside it; {} gradients let go at their block's \
         reduce-scatter, which keeps 1/{} of them; the activations (the batch is per rank) as \
         the run had them",
        s.world,
        s.way,
        crate::fixedfmt::Escaped(s.class.as_bytes()),
        s.per_step,
        s.sharded_requests,
        human_bytes(s.sharded_bytes),
        s.world,
        buckets,
        human_bytes(s.unit_bytes),
        human_bytes(s.root_bytes),
        kept,
        s.gradients,
        s.world,
    );
    if s.buffers > 0 {
        let _ = writeln!(
            o,
            "  {} buffers made among the parameters ({}) take no gradient (a batch norm's \
             running statistics): left whole on every rank, as FSDP2 leaves a module's buffers",
            s.buffers,
            human_bytes(s.buffer_bytes),
        );
    }
    let b = &s.broadcast;
    if b.parameters > 0 {
        let nodes: Vec<String> = b
            .nodes
            .iter()
            .map(|n| crate::fixedfmt::Escaped(n.as_bytes()).to_string())
            .collect();
        let which = match b.parameters {
            1 => "1 parameter gets its gradient".to_string(),
            n => format!("{n} parameters get their gradients"),
        };
        let (bytes, nodes, w) = (human_bytes(b.bytes), nodes.join(", "), s.world);
        let _ = writeln!(
            o,
            "  {which} ({bytes}) from a broadcast's backward ({nodes}): kept whole on every rank \
             and gathered {w} times, as FSDP2 keeps a parameter of first dimension 1 (a class \
             token, a position table; a trace holds sizes, not shapes): where one's first \
             dimension is {w} or more (a bias added by hand), FSDP2 cuts it to 1/{w} and the \
             rows are high by up to its bytes times {w}"
        );
    }
    if s.gradients == 0 {
        let _ = writeln!(
            o,
            "  the run made no gradient of its own (DDP's gradient_as_bucket_view=True, or \
             gradients summed into from an earlier step): the rank's shards of them are not in \
             the rows below, which are low by the model's gradients over {}",
            s.world
        );
    }
    if s.with_backward < s.blocks {
        let _ = writeln!(
            o,
            "  {} of the run's {} blocks have no backward the frames show (no autograd \
             sequence numbers): they are not gathered, so their rows are low by their \
             gathered parameters",
            s.blocks - s.with_backward,
            s.blocks
        );
    }
}

/// What `--shard zero1|zero2|zero3` changed, in one line.
fn zero_line(
    o: &mut String,
    s: &crate::report::torch_allocator::Sharded,
    z: &crate::report::torch_allocator::ZeroSaid,
) {
    use std::fmt::Write as _;
    let buckets = dropped(s.dropped_bytes);
    if z.stage == 3 {
        let _ = writeln!(
            o,
            "rank {} of {} as DeepSpeed's ZeRO-3 holds it (--shard zero3; fp32; \
             reduce_bucket_size {} elements; DeepSpeed's defaults, under which a model of fewer \
             than 1e9 elements is gathered whole at each forward's start): each parameter's \
             partition in one buffer of {}, the fp32 master copy of it and each of the \
             optimizer's {} lines of state one tensor of its size; {}the parameters gathered \
             whole ({}) on a stream of their own at each forward's start, each let go with its \
             gradient as the gradient's hook runs ({} gradients into a bucket of {}, kept for \
             the run); the partition's gradients ({}) kept; the activations (the batch is per \
             rank) as the run had them",
            z.rank,
            z.world,
            z.bucket_elements,
            human_bytes(z.partition_bytes),
            z.states,
            buckets,
            human_bytes(z.flat_bytes),
            z.gradients,
            human_bytes(z.bucket_bytes),
            human_bytes(z.partition_gradient_bytes),
        );
        return;
    }
    let _ = writeln!(
        o,
        "rank {} of {} as DeepSpeed's ZeRO-{} holds it (--shard {}; fp32; reduce_bucket_size \
         {} elements; contiguous gradients and no overlap_comm, DeepSpeed's defaults): \
         the parameters flattened into one buffer of {}, whole on every rank; the fp32 master \
         copy of the rank's partition ({}) and each of the optimizer's {} lines of state one \
         tensor of it; {}each of {} gradients let go into a gradient bucket of {} as its hook \
         runs, the partition's gradients ({}) kept from the backward's end to the step; the \
         activations (the batch is per rank) as the run had them",
        z.rank,
        z.world,
        z.stage,
        s.way,
        z.bucket_elements,
        human_bytes(z.flat_bytes),
        human_bytes(z.partition_bytes),
        z.states,
        buckets,
        z.gradients,
        human_bytes(z.bucket_bytes),
        human_bytes(z.partition_gradient_bytes),
    );
    if z.gradients == 0 {
        let _ = writeln!(
            o,
            "  the run made no gradient of its own (DDP's gradient_as_bucket_view=True, or \
             gradients summed into from an earlier step): the gradient bucket and the \
             partition's gradients are not in the rows below"
        );
    }
}

/// What `--world-size` changed, in one line.
pub(super) fn world_line(o: &mut String, w: &crate::report::fit::WorldSize) {
    use std::fmt::Write as _;
    if w.sharded_requests == 0 {
        let _ = writeln!(
            o,
            "one rank of the job at world size {} from the run's {} under {}: nothing this rank \
             holds is a shard of the model (every rank keeps the whole model, its gradients, \
             buckets and optimizer state), so the rows are the run's rank's at any world size; \
             the batch is per rank",
            w.asked, w.run, w.framework
        );
        buckets_line(o, w);
        deferred_line(o, w.deferred_frees);
        return;
    }
    let _ = writeln!(
        o,
        "one rank of the job at world size {} from the run's {} under {}: {} requests of its shards \
         (parameters, gradients, optimizer state and the optimizer's temporaries: {} at {} \
         ranks) resized to {}; the gathered parameters, the activations (the batch is per rank) \
         and the rest kept as the run had them",
        w.asked,
        w.run,
        w.framework,
        w.sharded_requests,
        human_bytes(w.sharded_bytes),
        w.run,
        human_bytes(
            u64::try_from(
                (u128::from(w.sharded_bytes) * u128::from(w.run))
                    .div_ceil(u128::from(w.asked.max(1)))
            )
            .unwrap_or(u64::MAX)
        )
    );
    if let Some(n) = w.all_gathers_added {
        let _ = writeln!(
            o,
            "  {n} all-gather outputs added, one a unit's gathering: FSDP2 makes each unit's \
             parameters whole straight from its shards at one rank, and out of an all-gather \
             output of the unit's bytes at more"
        );
    }
    deferred_line(o, w.deferred_frees);
}

/// What DDP's first buckets make of a rank's answer, or nothing. A run at one rank holds them
/// beside the rebuilt ones into the next step (no collective to wait for): the most a rank
/// reaches. Ranks of a job let them go before the rebuild or after, some on into the next
/// step, as NCCL's collectives complete: traces of four H200s show each, rank by rank.
fn buckets_line(o: &mut String, w: &crate::report::fit::WorldSize) {
    use std::fmt::Write as _;
    let (held, let_go) = (
        w.first_buckets_bytes.unwrap_or(0),
        w.first_buckets_let_go_bytes.unwrap_or(0),
    );
    let made = held.saturating_add(let_go);
    if made == 0 {
        return;
    }
    if w.run == 1 {
        let _ = writeln!(
            o,
            "  DDP's first buckets ({}) held until the rebuilt ones are made, as in the run: \
             the most a rank reaches. Ranks let them go before the rebuild or after, as NCCL's \
             collectives complete (real jobs do either, rank by rank), so a rank's peak can be \
             up to {} lower",
            human_bytes(made),
            human_bytes(made)
        );
        return;
    }
    let did = match (held, let_go) {
        (_, 0) => "held them until the rebuilt ones were made".to_string(),
        (0, _) => "let them go before the rebuilt ones were made".to_string(),
        (h, _) => format!(
            "held {} of them until the rebuilt ones were made",
            human_bytes(h)
        ),
    };
    let _ = writeln!(
        o,
        "  DDP's first buckets ({}): the run's rank {did}. Ranks let them go before the rebuild \
         or after, some on into the next step, as NCCL's collectives complete (real jobs do \
         each, rank by rank), so another rank's peak can be up to {} lower or higher than \
         these rows",
        human_bytes(made),
        human_bytes(made)
    );
}

/// What the run's frees that waited on other streams make of the answer, or nothing.
fn deferred_line(o: &mut String, n: u64) {
    use std::fmt::Write as _;
    if n > 0 {
        let _ = writeln!(
            o,
            "  {n} of the run's frees waited on work of other streams (as FSDP1 lets its \
             gathered flat parameters go): how many are still pending when the next unit \
             gathers follows the GPU's timing, so a job's ranks, and runs of one program, peak \
             apart for it (up to 9% on four H200s, docs/gpu-checks.md); the rows keep this \
             run's order"
        );
    }
}

/// What `--shard` said it did not make of DDP's own buffers (`bytes` of them), or nothing.
fn dropped(bytes: u64) -> String {
    match bytes {
        0 => String::new(),
        b => format!(
            "DDP's own buffers not made (its buckets, its broadcast of the model's states: {} \
             over the run); ",
            human_bytes(b)
        ),
    }
}
