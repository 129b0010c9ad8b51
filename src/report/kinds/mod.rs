//! Memory by kind: every tensor of the framework's allocator is a parameter, a gradient,
//! optimizer state, an activation, a temporary, input, a cuBLAS workspace or unknown, decided
//! from what the default run records, with no change to the program (`docs/kinds.md` says how,
//! and where it can be wrong).
//!
//! Two signals decide it ([`phase`]): the *phase* that made a tensor, from its Python frames,
//! and the tensor's *lifetime* ([`tracker`]): the phases follow one another in runs (a forward, a
//! backward, an optimizer step, the program's own lines between them); a tensor freed within the
//! run that made it is a temporary, one that outlives it is what its phase keeps. Here: the
//! kinds and their sums.

mod decided;
mod maker;
mod phase;
mod settle;
mod tracker;

pub use decided::Decided;
pub use phase::{
    DEEPSPEED_ZERO_1_2, DEEPSPEED_ZERO_3, Phase, backward_node_of, fsdp_resharding,
    kept_world_size, parallel_frameworks, phase_of_stack, workspace_sizes, world_size_text,
};
pub use settle::Settling;
pub use tracker::{KindTracker, StepsBegun};

use serde::Serialize;

/// The kind a line's tensors have when they outlive their phase's run, from its frames alone
/// (a ring's checkpoint keeps lines, not tensors): `None` where the frames say no phase.
pub fn lasting_kind_of_stack(
    tables: &crate::trace::reader::TraceTables,
    stack: u64,
) -> Option<Kind> {
    let phase = phase_of_stack(tables, stack);
    (phase != Phase::Unknown).then(|| maker::own(maker::maker_of(tables, stack), phase.lasting()))
}

/// The replay of the first `at` records of `reader` (as [`crate::report::live::replay_until`] makes
/// it) and the kind of each live tensor then, by address.
pub fn replay_with_kinds(
    reader: &mut crate::trace::reader::TraceReader,
    at: u64,
) -> (
    crate::report::live::Replay,
    crate::fasthash::FastMap<u64, Kind>,
) {
    let mut kinds = KindTracker::default();
    let mut window = Vec::new();
    let rp = crate::trace::live::replay_until_seeing(reader, at, |reader, r, past| {
        if past {
            window.push(*r);
        } else {
            kinds.observe(reader, r);
        }
    });
    let tensors: Vec<(u64, u64)> = rp
        .live
        .iter()
        .filter(|(_, l)| l.api == crate::trace::format::Api::Torch as u8)
        .map(|(&p, l)| (p, l.stack))
        .collect();
    let by_ptr = kinds.settle(reader, tensors, &window);
    (rp, by_ptr)
}

/// What a tensor is for.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Parameter,
    Gradient,
    OptimizerState,
    Activation,
    Temporary,
    Input,
    /// The workspaces PyTorch allocates for cuBLAS and cuBLASLt through its own allocator, one
    /// per handle and stream, kept for the whole run.
    Workspace,
    /// A data-parallel framework's own buffers, made by its own code (the innermost Python
    /// frame): FSDP's gathered parameters (a unit's whole, for its forward or backward) and its
    /// reduce-scatter's input. Its reduce-scatter's output is the rank's gradient, a
    /// gradient.
    Communication,
    Unknown,
}

impl Kind {
    /// Every kind, in the order reports list them.
    pub const ALL: [Kind; 9] = [
        Kind::Parameter,
        Kind::Gradient,
        Kind::OptimizerState,
        Kind::Activation,
        Kind::Temporary,
        Kind::Input,
        Kind::Workspace,
        Kind::Communication,
        Kind::Unknown,
    ];

    /// The kind's name in a sentence or a table row ("activations").
    pub fn name(self) -> &'static str {
        match self {
            Kind::Parameter => "parameters",
            Kind::Gradient => "gradients",
            Kind::OptimizerState => "optimizer state",
            Kind::Activation => "activations",
            Kind::Temporary => "temporaries",
            Kind::Input => "input",
            Kind::Workspace => "cuBLAS workspaces",
            Kind::Communication => "communication buffers",
            Kind::Unknown => "unknown",
        }
    }
}

/// One kind of tensor live at a moment: its bytes and the call sites that made them.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct KindHolders {
    pub kind: Kind,
    pub bytes: u64,
    pub tensors: u64,
    pub by_call_site: Vec<super::sites::Holder>,
}

/// `tensors` (each with its kind) by kind, in [`Kind::ALL`]'s order, and by call site within
/// each (`label` names a stack).
pub fn by_kind_and_site(
    tensors: &[(Kind, &super::live::Live)],
    label: impl Fn(u64) -> String,
) -> Vec<KindHolders> {
    Kind::ALL
        .iter()
        .filter_map(|&k| {
            let of: Vec<&super::live::Live> = tensors
                .iter()
                .filter(|(kk, _)| *kk == k)
                .map(|&(_, l)| l)
                .collect();
            (!of.is_empty()).then(|| KindHolders {
                kind: k,
                bytes: of.iter().fold(0u64, |a, l| a.saturating_add(l.size)),
                tensors: of.len() as u64,
                by_call_site: super::sites::holders(of.into_iter(), None, |l| l.stack, &label),
            })
        })
        .collect()
}

/// Bytes per kind, in [`Kind::ALL`]'s order, kinds with no bytes left out.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct ByKind(pub Vec<KindBytes>);

#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct KindBytes {
    pub kind: Kind,
    pub bytes: u64,
    pub tensors: u64,
}

impl ByKind {
    /// The sums of `items` (kind, bytes).
    pub fn of(items: impl IntoIterator<Item = (Kind, u64)>) -> ByKind {
        let mut sums = [(0u64, 0u64); Kind::ALL.len()];
        for (k, b) in items {
            let s = &mut sums[k as usize];
            s.0 = s.0.saturating_add(b);
            s.1 += 1;
        }
        ByKind(
            Kind::ALL
                .iter()
                .zip(sums)
                .filter(|(_, (b, n))| *b > 0 || *n > 0)
                .map(|(&kind, (bytes, tensors))| KindBytes {
                    kind,
                    bytes,
                    tensors,
                })
                .collect(),
        )
    }

    pub fn bytes(&self, kind: Kind) -> u64 {
        self.0
            .iter()
            .find(|k| k.kind == kind)
            .map_or(0, |k| k.bytes)
    }

    /// `parameters 1.2 GiB, gradients 1.2 GiB, ...`: the kinds in one line.
    pub fn line(&self) -> String {
        self.0
            .iter()
            .map(|k| format!("{} {}", k.kind.name(), super::units::human_bytes(k.bytes)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_sum_in_order() {
        let b = ByKind::of([
            (Kind::Activation, 10),
            (Kind::Parameter, 5),
            (Kind::Activation, 1),
        ]);
        assert_eq!(b.0[0].kind, Kind::Parameter);
        assert_eq!(b.bytes(Kind::Activation), 11);
        assert_eq!(b.0[1].tensors, 2);
    }
}
