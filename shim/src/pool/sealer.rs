//! Checkpoints made ahead, on a helper thread. A checkpoint costs the host about 60 µs when
//! PyTorch has made its 64 pool streams (a `cuStreamQuery` for each), and two
//! thirds of them are made ahead of need, at the spacing of `SEAL_SPACING`, so that blocks
//! freed with `cudaFree` pass their fences before the cache runs dry (GPT-2: 457
//! checkpoints, 298 ahead). Made on the program's thread, each cost the allocation that
//! happened to make it; here the pool hands the helper one request at a time (the streams to
//! cover, spare events) and takes the answer at its next look, so the program's thread only
//! sends and receives. A checkpoint needed now (nothing fitted) is still made on the calling
//! thread, after waiting for the one in flight.
//!
//! Contract 7: the helper records events and queries streams, which must never happen in the
//! instant a capture begins (the event would join the graph, the query invalidate it). The
//! helper works under [`SWEEP`], which the capture-begin hook also takes (after the pool's
//! lock) around the program's begin call, and gives up when a capture is under way; a
//! checkpoint not made is simply not made: its fences are covered by the next one, which
//! names a later id. The helper never takes the pool's lock, so the hook, which takes the
//! pool's lock first, and a thread that waits for an answer under the pool's lock cannot wait
//! for each other.

use super::capture::{pool_quiet, set_relaxed_capture_mode};
use super::context::{context_handle, in_context};
use crate::cuda::ffi::CU_EVENT_DISABLE_TIMING;
use crate::cuda::real;
use crate::cuda::symbols::sig::of;
use crate::os::SpinLock;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::time::Duration;

/// Held by the helper while it records or queries, and by the capture-begin hook around the
/// program's begin call.
pub(super) static SWEEP: SpinLock = SpinLock::new();

/// A checkpoint to make: checkpoint `id` of context `slot`, over the legacy stream and
/// `streams`, with events from `spare` first.
pub(super) struct Request {
    pub(super) slot: u8,
    pub(super) id: u64,
    pub(super) streams: Vec<u64>,
    pub(super) spare: Vec<usize>,
    pub(super) untracked: bool,
}

/// What the helper did: the checkpoint's events and whether it is broken (`None`: not made, a
/// capture was under way), the spare events it did not use, and how long it took (ns).
pub(super) struct Answer {
    pub(super) slot: u8,
    pub(super) id: u64,
    pub(super) made: Option<(Vec<usize>, bool)>,
    pub(super) spare: Vec<usize>,
    pub(super) took_ns: u64,
}

/// The pool's end of the helper: one request in flight at most.
pub(super) struct Sealer {
    to: SyncSender<Request>,
    from: Receiver<Answer>,
}

/// How long a thread that needs the checkpoint in flight waits for it before giving up on it
/// (the helper is only this slow if the driver is stuck; a late answer is still taken).
const PATIENCE: Duration = Duration::from_secs(10);

impl Sealer {
    /// Starts the helper thread; `None` if it cannot be started (checkpoints are then made on
    /// the calling thread, as before).
    pub(super) fn start() -> Option<Sealer> {
        let (to, requests) = sync_channel::<Request>(1);
        let (answers, from) = sync_channel::<Answer>(1);
        std::thread::Builder::new()
            .name("gpushim-seal".into())
            .spawn(move || serve(requests, answers))
            .ok()?;
        Some(Sealer { to, from })
    }

    /// Hands `r` to the helper; gives it back if the helper is busy or gone.
    pub(super) fn send(&self, r: Request) -> Result<(), Request> {
        self.to.try_send(r).map_err(|e| match e {
            TrySendError::Full(r) | TrySendError::Disconnected(r) => r,
        })
    }

    /// The helper's answer, if it has one now (`wait`: waiting up to [`PATIENCE`] for it).
    pub(super) fn answer(&self, wait: bool) -> Option<Answer> {
        if wait {
            return self.from.recv_timeout(PATIENCE).ok();
        }
        self.from.try_recv().ok()
    }
}

fn serve(requests: Receiver<Request>, answers: SyncSender<Answer>) {
    let _guard = crate::guard::Guard::enter();
    // Belt and braces: in relaxed mode this thread's calls can never invalidate a capture.
    let _ = set_relaxed_capture_mode();
    while let Ok(mut r) = requests.recv() {
        let t0 = now_ns();
        let c0 = crate::costs::start();
        let held = SWEEP.lock();
        let made =
            (!pool_quiet()).then(|| make_events(r.slot, &r.streams, &mut r.spare, r.untracked));
        drop(held);
        crate::costs::end(crate::costs::Cost::Seal, c0);
        if made.is_some() {
            crate::costs::end(crate::costs::Cost::SealAhead, c0);
        }
        let answer = Answer {
            slot: r.slot,
            id: r.id,
            made,
            spare: r.spare,
            took_ns: now_ns().saturating_sub(t0),
        };
        if answers.send(answer).is_err() {
            return;
        }
    }
}

fn now_ns() -> u64 {
    gpushim_core::trace::recorder::clock_ns(libc::CLOCK_MONOTONIC)
}

/// The events of one checkpoint of context `slot`: with `GPUSHIM_CTX_EVENTS=1`, one event that
/// covers everything issued to the context (`cuCtxRecordEvent`, CUDA 12.5); otherwise, or where
/// the driver has none, an event on the legacy stream and on each of `streams` that still has
/// work queued. A stream with none (`cuStreamQuery` answers 0: everything ever issued to it
/// finished) needs no event: PyTorch makes 64 streams it rarely uses, and a checkpoint of 65
/// events cost about 100 µs of host time, one of 64 queries 57 µs (H100), the context's one
/// event 2 µs (measured with scripts/gpu/ctx_event_probe.cu; docs/cuda-facts.md). Events come
/// from `spare` first. Returns the events and whether the checkpoint is broken (an event could
/// not be made or recorded, or streams went untracked: only a synchronization passes it).
/// Never called during a capture.
pub(super) fn make_events(
    slot: u8,
    streams: &[u64],
    spare: &mut Vec<usize>,
    untracked: bool,
) -> (Vec<usize>, bool) {
    let create = real::function::<of::CuEventCreate>();
    let record = real::function::<of::CuEventRecord>();
    let idle = real::function::<of::CuStreamQuery>();
    let whole = real::function::<of::CuCtxRecordEvent>().filter(|_| context_events());
    let ctx = context_handle(slot);
    let mut events = Vec::with_capacity(1 + streams.len());
    let mut broken = untracked;
    in_context(slot, || {
        let event = |spare: &mut Vec<usize>, broken: &mut bool| match spare.pop() {
            Some(ev) => Some(ev),
            None => {
                let mut ev = 0usize;
                // SAFETY: `ev` is a valid out-pointer.
                let ok =
                    create.is_some_and(|c| unsafe { c(&mut ev, CU_EVENT_DISABLE_TIMING) } == 0);
                if !ok {
                    *broken = true;
                }
                ok.then_some(ev)
            }
        };
        if let Some(f) = whole
            && let Some(ev) = event(spare, &mut broken)
        {
            // SAFETY: an event of this context, recorded for the whole of it.
            let rc = unsafe { f(ctx, ev) };
            if rc == 0 {
                events.push(ev);
                return;
            }
            // It refused: one event per stream from now on.
            refuse_context_events(rc);
            spare.push(ev);
        }
        for &stream in core::iter::once(&0u64).chain(streams.iter()) {
            // SAFETY: a stream of this context the program created and has not destroyed: the
            // stream hooks keep the list, and the destroy hook waits for the checkpoint in
            // flight before the stream goes (`pool::stream_destroying`); never captured here.
            if stream != 0 && idle.is_some_and(|q| unsafe { q(stream as usize) } == 0) {
                continue;
            }
            let Some(ev) = event(spare, &mut broken) else {
                continue;
            };
            // SAFETY: an event of this context recorded on a stream of this context.
            if record.is_some_and(|r| unsafe { r(ev, stream as usize) } == 0) {
                events.push(ev);
            } else {
                spare.push(ev);
                broken = true;
            }
        }
    });
    (events, broken)
}

/// Whether checkpoints use `cuCtxRecordEvent` (see `backend::seal`): unknown until the first checkpoint
/// asks. Off unless `GPUSHIM_CTX_EVENTS=1`: measured on the H100, the context's
/// event cost 2.4 µs where a checkpoint of one event per stream cost 57 µs, yet in paired
/// rounds the builds with it stepped 2 to 9% slower in 5 of 5 (transformer, ResNet-50), and
/// in one ResNet-50 process checkpoints still took 61 µs each, four times as many; until that
/// is understood, one event per stream stays the default.
static CTX_EVENTS: crate::os::LazyFlag = crate::os::LazyFlag::new();
/// What an unset `GPUSHIM_CTX_EVENTS` means.
const CTX_EVENTS_DEFAULT: bool = false;

/// Whether to try `cuCtxRecordEvent` for this checkpoint.
pub(super) fn context_events() -> bool {
    CTX_EVENTS.get(|| crate::state::settings().ctx_events || CTX_EVENTS_DEFAULT)
}

/// `cuCtxRecordEvent` answered `rc`: one event per stream from now on, said once.
pub(super) fn refuse_context_events(rc: i32) {
    CTX_EVENTS.set(false);
    crate::os::say(format_args!(
        "cuCtxRecordEvent answered {rc}; checkpoints record an event per stream from now on"
    ));
}
