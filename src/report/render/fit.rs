//! `fit`'s text: a table per setting, the largest batch, the lines kept at their size.

use crate::report::fit::{Fit, LineBytes, SeqAxis, setting_name};
use crate::report::units::human_bytes;

/// The fit as text: a table per setting, the largest batch, what was not scaled.
pub fn render(f: &Fit) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    if f.nothing_scales() {
        // The reason that decides comes first.
        let _ = writeln!(
            o,
            "nothing of this run's requests follows the batch ({} of unknown kind, {} fixed): \
             every batch below replays as the run did, and no largest batch can be said. The \
             kinds need PyTorch's tensors with their Python frames (the default run records \
             them); or give a second run at another batch (--with)",
            human_bytes(f.unknown_bytes),
            human_bytes(f.fixed_bytes)
        );
    }
    // What the run was is said before anything that rests on it.
    if let Some(cut) = &f.incomplete {
        let _ = writeln!(
            o,
            "the trace is incomplete: {cut}; every replay below is of the requests it holds, \
             so a tensor whose free is missing counts as held to the end and a request that is \
             missing is not made: the peaks can be off either way and the largest batch with \
             them"
        );
    }
    if let Some(l) = &f.leaking {
        leaking_lines(&mut o, f, l);
    }
    let _ = writeln!(
        o,
        "from a run at batch {}: {} of its requests grow with the batch, {} do not{}",
        f.at,
        human_bytes(f.batch_bytes),
        human_bytes(f.fixed_bytes),
        if f.unknown_bytes > 0 {
            format!(
                ", {} of unknown kind kept as they are",
                human_bytes(f.unknown_bytes)
            )
        } else {
            String::new()
        }
    );
    if let Some(r) = &f.ring {
        ring_line(&mut o, r);
    }
    if f.reductions > 0 {
        let _ = writeln!(
            o,
            "  {} staging buffers of PyTorch's reductions grow with the batch only until they \
             fill the device, as PyTorch sizes them",
            f.reductions
        );
    }
    if let Some(l) = &f.latent_reductions {
        let from = match l.from_batch {
            Some(b) => format!("from batch {b} on"),
            None => "at no batch below 2^32".to_string(),
        };
        let (sums, ask) = if l.count == 1 {
            ("sum", "asks")
        } else {
            ("sums", "ask")
        };
        let _ = writeln!(
            o,
            "  {} {sums} of a bias's gradient made within thread blocks at batch {} {ask} \
             PyTorch's reduction a staging buffer and a semaphore {from}: added as PyTorch \
             sizes them",
            l.count, f.at
        );
    }
    // The trace's name is as `files::shown` wrote it: escaped already.
    if let Some(r) = &f.second {
        let _ = writeln!(
            o,
            "  {} requests scaled as the run at batch {} ({}) showed them: each on the line \
             through its two sizes",
            r.requests, r.at, r.trace
        );
    }
    if let Some(c) = &f.checkpoint {
        checkpoint_line(&mut o, f.at, c);
    }
    if let Some(a) = &f.autocast {
        autocast_line(&mut o, f.at, a);
    }
    if let Some(s) = &f.shard {
        super::fit_jobs::shard_line(&mut o, s);
    }
    if let Some(w) = &f.world_size {
        super::fit_jobs::world_line(&mut o, w);
    }
    let _ = writeln!(
        o,
        "limit: {} ({})",
        human_bytes(f.limit_bytes),
        f.limit_from
    );
    for s in &f.settings {
        setting_table(&mut o, f, s);
    }
    settings_compared(&mut o, f);
    if let Some(a) = &f.seq {
        seq_axis(&mut o, a, f.at);
    }
    lines(
        &mut o,
        "kept at their size, their kind unknown (no Python frames)",
        &f.unknown_lines,
    );
    lines(
        &mut o,
        "kept at their size, a weight's gradient or 16-bit copy (a parameter's size or half)",
        &f.parameter_sized_lines,
    );
    o
}

/// Which of the two settings fits the larger batch, by how much, and how to set it.
fn settings_compared(o: &mut String, f: &Fit) {
    use std::fmt::Write as _;
    if let [a, b] = f.settings.as_slice()
        && a.largest_batch != b.largest_batch
        && !f.nothing_scales()
        && !(a.largest_is_the_cap && b.largest_is_the_cap)
    {
        let (more, less) = if a.largest_batch > b.largest_batch {
            (a, b)
        } else {
            (b, a)
        };
        // The defaults are PYTORCH_CUDA_ALLOC_CONF unset, not set to nothing.
        let how = if more.setting.is_empty() {
            "PYTORCH_CUDA_ALLOC_CONF unset".to_string()
        } else {
            format!("PYTORCH_CUDA_ALLOC_CONF={}", more.setting)
        };
        let _ = writeln!(
            o,
            "\n{} fits {} more than {} ({how})",
            setting_name(&more.setting),
            more.largest_batch - less.largest_batch,
            setting_name(&less.setting),
        );
    }
}

/// The lines kept at their size, under `title`, if any.
fn lines(o: &mut String, title: &str, lines: &[LineBytes]) {
    use std::fmt::Write as _;
    if lines.is_empty() {
        return;
    }
    let _ = writeln!(o, "\n{title}:");
    for l in lines {
        let _ = writeln!(
            o,
            "  {:>12} in {:>6}  {}",
            human_bytes(l.bytes),
            l.tensors,
            l.line
        );
    }
}

/// One setting's table of batches and its largest batch (or why there is none).
fn setting_table(o: &mut String, f: &Fit, s: &crate::report::fit::SettingFit) {
    use std::fmt::Write as _;
    let _ = writeln!(
        o,
        "\n{} ({}):",
        setting_name(&s.setting),
        if s.recorded {
            "the run's setting"
        } else {
            "switched"
        }
    );
    let _ = writeln!(
        o,
        "  {:>7}  {:>14}  {:>14}",
        "batch", "peak reserved", "peak allocated"
    );
    for r in &s.rows {
        let _ = writeln!(
            o,
            "  {:>7}  {:>14}  {:>14}{}",
            r.batch,
            human_bytes(r.peak_reserved_bytes),
            human_bytes(r.peak_allocated_bytes),
            if r.failures > 0 {
                "  does not fit".to_string()
            } else if r.workspaces_done_without > 0 {
                format!(
                    "  ({} convolution workspaces done without: cuDNN picks algorithms \
                     needing less)",
                    r.workspaces_done_without
                )
            } else {
                String::new()
            }
        );
    }
    if f.nothing_scales() {
        let _ = writeln!(
            o,
            "  the largest batch that fits: not known (nothing scales)"
        );
    } else if s.largest_batch == 0 {
        let _ = writeln!(o, "  not even a batch of 1 fits the limit");
    } else if s.largest_is_the_cap {
        let _ = writeln!(
            o,
            "  every batch up to {} fits (the search's cap; --max-batch looks further)",
            s.largest_batch
        );
    } else {
        let _ = writeln!(
            o,
            "  the largest batch that fits: {} (peak reserved {})",
            s.largest_batch,
            human_bytes(s.largest_peak_reserved_bytes)
        );
    }
}

/// The sequence length's table: how the requests follow it, then per length and setting the
/// peaks at the run's batch and the largest batch that fits.
fn seq_axis(o: &mut String, a: &SeqAxis, batch: u64) {
    use std::fmt::Write as _;
    let part = |(n, bytes): (u64, u64), what: &str| {
        (n > 0).then(|| format!("{n} ({}) {what}", human_bytes(bytes)))
    };
    let parts: Vec<String> = [
        part(a.linear, "grow in proportion to the length"),
        part(a.square, "with its square (as attention's scores do)"),
        part(a.line, "in part (on the line through their two sizes)"),
        part(a.same, "not at all"),
        part(
            a.by_kind,
            "as their kinds say (no counterpart found in the second run)",
        ),
    ]
    .into_iter()
    .flatten()
    .collect();
    // The trace's name is as `files::shown` wrote it: escaped already.
    let _ = writeln!(
        o,
        "\nby sequence length, from the run at {} and the one at {} ({}): of the requests, {}",
        a.at,
        a.other,
        a.trace,
        parts.join(", ")
    );
    let _ = writeln!(
        o,
        "  {:>7}  {:<28}  {:>14}  {:>14}  {:>13}",
        "length",
        "setting",
        format!("reserved at {batch}"),
        format!("allocated at {batch}"),
        "largest batch"
    );
    for r in &a.lengths {
        for s in &r.settings {
            let _ = writeln!(
                o,
                "  {:>7}  {:<28}  {:>14}  {:>14}  {:>13}{}",
                r.length,
                setting_name(&s.setting),
                human_bytes(s.row.peak_reserved_bytes),
                human_bytes(s.row.peak_allocated_bytes),
                s.largest_batch,
                if s.row.failures > 0 {
                    "  does not fit"
                } else {
                    ""
                }
            );
        }
    }
}

/// What a `--checkpoint` what-if checkpointed, in one line.
fn checkpoint_line(o: &mut String, at: u64, c: &crate::report::torch_allocator::Blocks) {
    use std::fmt::Write as _;
    if c.checkpointed == 0 || c.saved_bytes == 0 {
        // A what-if that edits nothing: said plainly, the rows below being the run's own.
        let _ = writeln!(
            o,
            "--checkpoint changes nothing in this run: {}; every row below is the run's own, \
             as without it (the baseline)",
            if c.checkpointed == 0 {
                format!(
                    "no backward of its {} blocks of {} was found in the trace (a block's \
                     backward is told by the autograd nodes its forward made)",
                    c.blocks,
                    crate::fixedfmt::Escaped(c.class.as_bytes())
                )
            } else {
                format!(
                    "the blocks of {} kept nothing for their backward at batch {at}",
                    crate::fixedfmt::Escaped(c.class.as_bytes())
                )
            }
        );
        return;
    }
    // The class is an identifier (checkpoint.rs finds no other name); escaped all the same.
    let _ = writeln!(
        o,
        "with activation checkpointing of {} ({} blocks a step, {}): what the blocks kept \
         for the backward ({} at batch {}) goes once used in the forward, and is made \
         again one block at a time in the backward, {}{}",
        crate::fixedfmt::Escaped(c.class.as_bytes()),
        c.per_step,
        if c.found {
            "found from the frames"
        } else {
            "named"
        },
        human_bytes(c.saved_bytes),
        at,
        if c.reentrant && c.way_asked {
            "its forward whole, as torch.utils.checkpoint(use_reentrant=True) does"
        } else if c.reentrant {
            "its forward whole, as torch.utils.checkpoint(use_reentrant=True) does (the \
             default of transformers' gradient_checkpointing_enable(), whose block this is)"
        } else {
            "up to its last saved tensor, each let go once its backward used it, as \
             torch.utils.checkpoint(use_reentrant=False) does"
        },
        if c.checkpointed < c.blocks {
            format!(
                " ({} of {} blocks whose backward was not found run as they did)",
                c.blocks - c.checkpointed,
                c.blocks
            )
        } else {
            String::new()
        }
    );
}

/// What an `--autocast` what-if changed, in one line.
fn autocast_line(o: &mut String, at: u64, a: &crate::report::torch_allocator::AutocastSummary) {
    use std::fmt::Write as _;
    let _ = writeln!(
        o,
        "as under autocast to {} (from the autograd graph, {} nodes a step): requests made \
         in 16 bits save {} over the run at batch {at}; a step copies {} parameters ({}) and \
         {} activations ({} at batch {at}); {} 32-bit tensors are no longer kept for the \
         backward (docs/fit.md says where it can be wrong)",
        if a.dtype == "fp16" { "fp16" } else { "bf16" },
        a.graph_nodes,
        human_bytes(a.halved_bytes),
        a.parameter_copies,
        human_bytes(a.parameter_copy_bytes),
        a.activation_copies,
        human_bytes(a.activation_copy_bytes),
        a.freed_earlier,
    );
}

/// How much of the run a ring's records hold, and a warning where it is a pass or two.
fn ring_line(o: &mut String, r: &crate::report::kinds::StepsBegun) {
    use std::fmt::Write as _;
    if r.few() {
        let _ = writeln!(
            o,
            "warning: the trace is a ring, and the records its replay starts from hold only \
             {r} of the run: every peak and batch below is of those alone. A larger \
             trace_max (GPUSHIM_CONF=trace_max:...) keeps more of the run"
        );
    } else {
        let _ = writeln!(
            o,
            "  the trace is a ring: replayed from its checkpoint on, {r} (the run's first \
             steps are not in it)"
        );
    }
}

/// The run leaks: said first, with what it does to the answers below.
fn leaking_lines(o: &mut String, f: &Fit, l: &crate::report::fit::Leaking) {
    use std::fmt::Write as _;
    let kind = l
        .kind
        .as_deref()
        .map(|k| format!(" ({k})"))
        .unwrap_or_default();
    let _ = writeln!(
        o,
        "the run leaks: its memory grows {} per iteration over {} iterations, most at \
         {}{kind} (`gpushim leaks` names every line); the replays below hold what it had grown \
         to, {} by the last iteration, so their peaks and the largest batch are of this run's \
         length and not of a steady step",
        human_bytes(l.bytes_per_iteration),
        l.iterations,
        l.line,
        human_bytes(l.grown_bytes),
    );
    if let Some(s) = &l.steady {
        let at = s.rows.iter().find(|r| r.batch == f.at);
        let largest = if s.largest_batch == 0 {
            "none".to_string()
        } else {
            format!(
                "{}{}",
                s.largest_batch,
                if s.largest_is_the_cap { " or more" } else { "" }
            )
        };
        let _ = writeln!(
            o,
            "  without the growth (what earlier iterations kept on the growing lines let go, the \
             last one's kept: a steady step), under {}: peak reserved {} at batch {}, the \
             largest batch that fits {largest}",
            setting_name(&s.setting),
            at.map_or_else(|| "-".to_string(), |r| human_bytes(r.peak_reserved_bytes)),
            f.at,
        );
    }
    if let Some(n) = l.iterations_until_full {
        let _ = writeln!(
            o,
            "  at batch {}, the growth alone fills the room left under {} in about {n} more \
             iterations: mend the leak before choosing a batch",
            f.at,
            human_bytes(f.limit_bytes)
        );
    }
}
