//! The command line: every command, its options and their help.

use super::help::{ANALYZE_HELP, FIT_HELP, SIMULATE_HELP};
pub use super::reading::Reading;
pub use super::values::{Autocast, FlameColor, PlotBy, ShardWay};
use super::values::{Batches, batches_arg, device_arg, export_formats, fraction_arg, size_arg};
use clap::{Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "gpushim",
    version,
    about = "Trace every CUDA memory call of a program, then ask where the memory went.",
    long_about = "Trace every CUDA memory call of a program, then ask where the memory went.\n\n\
        Run a program under the shim:     gpushim run -- python train.py\n\
        Read what it recorded:            gpushim summary gpushim-python.12345.trace\n\n\
        Without this command:  LD_PRELOAD=/path/to/libgpushim.so python train.py\n\
        Settings (environment): GPUSHIM_CONF (see `gpushim config`), GPUSHIM_TRACE=PATTERN|off, \
        GPUSHIM_DISABLE=1."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Run a command with the shim preloaded; print where its traces are and what they hold.
    #[command(
        after_help = "Example:\n  gpushim run -- python train.py --epochs 1\n\n\
        With nothing set, PyTorch keeps its own allocator and the trace holds every tensor it \
        hands out (torch 2.4 to 2.11, through its allocator trace), with the Python line that \
        made it, beside the segments its cache takes from CUDA: no flag is needed to find the \
        line that leaks. --per-tensor and --pluggable replace PyTorch's allocator instead; use \
        them to test the shim's pool on a PyTorch program, or for a PyTorch whose allocator \
        trace gpushim cannot read (the run says so). Any LD_PRELOAD already set is kept, after \
        the shim. The exit code is the command's."
    )]
    Run {
        /// GPUSHIM_CONF for the run, as in `pool:off,limit:24GiB` (see `gpushim config`).
        #[arg(long)]
        conf: Option<String>,
        /// Trace path pattern: %p pid, %h host, %r rank (RANK or LOCAL_RANK), %% a percent sign.
        /// Default: gpushim-PROGRAM.PID.trace in the working directory.
        #[arg(long, value_name = "PATTERN")]
        trace: Option<String>,
        /// The shim library; default: $GPUSHIM_LIB, else libgpushim.so next to this executable,
        /// else (an installed wheel) the copy it writes out to ~/.cache/gpushim.
        #[arg(long, value_name = "PATH")]
        lib: Option<PathBuf>,
        /// PyTorch's cache off (PYTORCH_NO_CUDA_MEMORY_CACHING=1) and the shim's pool on
        /// (pool:caching,medium:20MiB unless --conf names a pool): every tensor is a
        /// cudaMalloc the pool serves. Costs device memory (2.5 to 2.8x PyTorch's on GPT-2)
        /// and CUDA graphs cannot be captured (PyTorch's limit with its cache off). Not needed
        /// to see tensors: the default run records them. PyTorch's counters answer from the
        /// shim's pool.
        #[arg(long)]
        per_tensor: bool,
        /// The shim's pool as PyTorch's allocator, through its pluggable allocator interface
        /// (pool:expandable unless --conf names a pool), installed at `import torch` with no
        /// code change. CUDA graphs work, but not torch.compile's mode="reduce-overhead"
        /// (PyTorch's graph trees need its own allocator), and memory snapshots raise. Not
        /// needed to see tensors: the default run records them. PyTorch's memory statistics
        /// answer from the shim's pool ("all" figures only).
        #[arg(long, conflicts_with = "per_tensor")]
        pluggable: bool,
        /// The command and its arguments (after `--` when they start with a dash).
        #[arg(
            required = true,
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "CMD"
        )]
        cmd: Vec<OsString>,
    },
    /// Calls, bytes and failures per API; peak and final live memory per device; trace health.
    #[command(
        after_help = "Examples:\n  gpushim summary run.trace\n  gpushim summary rank*.trace          # each rank, then the job\n  gpushim summary run.trace --json | jq .health"
    )]
    Summary {
        /// Trace files (one per process or rank).
        #[arg(required = true)]
        traces: Vec<PathBuf>,
        /// The batch the run used: also says the headroom in batches, the largest batch that
        /// fits the device under the run's setting and with expandable segments (as `gpushim
        /// fit` finds it).
        #[arg(long, value_name = "BATCH", value_parser = clap::value_parser!(u64).range(1..))]
        at: Option<u64>,

        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        reading: Reading,
    },
    /// Replay a trace under other settings: PyTorch's own allocator under another
    /// PYTORCH_CUDA_ALLOC_CONF (--torch, --recommend), or the shim's pool under other policies
    /// (--conf): peak reserved, fragmentation and device allocation calls for each, beside what
    /// the run had.
    #[command(after_help = SIMULATE_HELP)]
    Simulate {
        /// The traces to replay (--conf: one).
        #[arg(required = true)]
        traces: Vec<PathBuf>,

        /// A policy in GPUSHIM_CONF syntax; repeat to compare several (default: the defaults).
        #[arg(long = "conf", value_name = "POLICY", conflicts_with_all = ["torch", "recommend"])]
        conf: Vec<String>,
        /// Replay PyTorch's caching allocator under this PYTORCH_CUDA_ALLOC_CONF text (PyTorch's
        /// own syntax; "" for its defaults); repeat to compare several. The setting the run
        /// used is always replayed too, and checked against the segments the run took.
        #[arg(long = "torch", value_name = "CONF")]
        torch: Vec<String>,
        /// Try the settings that matter (expandable segments, max_split_size_mb,
        /// roundup_power2_divisions, and with --fraction garbage_collection_threshold) and
        /// print the one with the lowest peak reserved, with the line to set.
        #[arg(long)]
        recommend: bool,
        /// Memory PyTorch may hold per device in the replay (e.g. 40GiB). Default: what the
        /// device had at the run's first failed tensor, else the device's memory.
        #[arg(long, value_name = "SIZE", value_parser = size_arg)]
        limit: Option<u64>,
        /// The program's torch.cuda.set_per_process_memory_fraction, if it set one (PyTorch
        /// runs its garbage collector only then).
        #[arg(long, value_name = "FRACTION", value_parser = fraction_arg)]
        fraction: Option<f64>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        reading: Reading,
    },
    /// Every record of a trace, one per line: CSV (default) or JSON lines.
    #[command(
        after_help = "Columns: time_ns (since the trace started), thread (index in the trace), \
        kind, api, device (empty when unknown), status (CUDA result code; 255 = a code above 254), \
        ptr (of a stack_ref: the stack's id; a backward tensor's stack joined to its forward \
        line has one from 2^62 up), size (of a stack_ref: the stack's frames in the low 8 bits, \
        PyTorch's autograd sequence number above them), stream (interned index; 0 = the null \
        stream), text (an NVTX range's or mark's name; a stack's frames, innermost first, written at \
        the first stack_ref of its id only: later ones carry the id in ptr, so the output grows \
        with the distinct stacks, not with every allocation's). In a trace that reached trace_max, the records \
        of kind restore and holding come from its checkpoint: what the run did before the ring.\n\n\
        Examples:\n  gpushim events run.trace > run.csv\n  gpushim events run.trace --json | grep -E '\"kind\":\"(tensor_oom|limit_hit)\"'   \
        # PyTorch's out-of-memory, the pool's limit"
    )]
    Events {
        /// The trace to print.
        trace: PathBuf,

        /// JSON lines instead of CSV.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        reading: Reading,
    },
    /// What was live at exit, by call site; and the call sites whose memory grows every
    /// iteration (iterations from a repeating NVTX range or mark, else a detected period).
    #[command(
        after_help = "Example:\n  gpushim run -- python train.py\n  gpushim leaks gpushim-python.1234.trace\n\n\
        Call sites are the allocating thread's Python frames, recorded by default (with \
        PyTorch, the line that made each tensor); a program that runs no Python (C, C++) gets \
        its native stacks by default too (stacks:auto); a Python program's native frames are \
        added with GPUSHIM_CONF=stacks:on and shown with --native-frames. An iteration \
        boundary is the moment one iteration ends and the next begins: \
        torch.cuda.nvtx.range_push(\"step\") (an NVTX range, NVIDIA's annotation API) marks \
        them with no \
        other change under `gpushim run`; without ranges a repeating allocation is taken as \
        the iteration.\n\n\
        \"kept alive with\" under a growing line names the growing lines whose memory was \
        freed right next to its own once it had outlived an iteration (a loss and the \
        activations its autograd graph saved, when a list of losses is cleared): what keeps \
        one alive keeps the others. A leak never freed before the trace ends is joined to \
        nothing."
    )]
    Leaks {
        /// Trace files (one per process or rank).
        #[arg(required = true)]
        traces: Vec<PathBuf>,

        /// The NVTX range (push/pop or start/end) or mark name that starts an iteration
        /// (default: the range that repeats most, else the mark).
        #[arg(long, value_name = "NAME")]
        boundary: Option<String>,
        /// Call sites shown of what is live at exit (a last line says how many more, and what
        /// they hold; --json has them all).
        #[arg(long, default_value_t = 10)]
        top: usize,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        reading: Reading,
    },
    /// The moment of peak live memory on each device, and what was live then, by call site and
    /// by NVTX range.
    #[command(
        after_help = "Examples:\n  gpushim peak run.trace\n  gpushim peak run.trace --top 20 --device 0\n  gpushim peak rank*.trace --json"
    )]
    Peak {
        /// Trace files (one per process or rank).
        #[arg(required = true)]
        traces: Vec<PathBuf>,

        /// Rows per table.
        #[arg(long, default_value_t = 10)]
        top: usize,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        reading: Reading,
    },
    /// Each failed allocation: the request, live and cached memory then, the largest free block
    /// in the pool, and the call sites holding the most.
    #[command(
        after_help = "Examples:\n  gpushim run -- python train.py        # says when an allocation failed\n  gpushim oom gpushim-python.1234.trace\n  gpushim oom run.trace --at 8          # also the largest batch that fits (from a run at 8)"
    )]
    Oom {
        /// Trace files.
        #[arg(required = true)]
        traces: Vec<PathBuf>,
        /// The batch the run used: says the largest batch that would have fit, under the
        /// run's setting and with expandable segments (as `gpushim fit` does). Default: read
        /// from the run's command line (--batch-size 8, ...), when it says one.
        #[arg(long, value_name = "BATCH", value_parser = clap::value_parser!(u64).range(1..))]
        at: Option<u64>,

        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        reading: Reading,
    },
    /// What fits: the peak memory at other batch sizes and the largest batch that fits a
    /// device, from one run at a small batch, without running it again.
    #[command(after_help = FIT_HELP)]
    Fit {
        /// The trace of a PyTorch training run (the default run records what it needs); the
        /// traces of a job's ranks give each rank's answer and the rank that fails first.
        #[arg(required = true, num_args = 1..)]
        traces: Vec<PathBuf>,
        /// The batch the run used. Default: read from the run's command line
        /// (--batch-size 8, --batch_size=8, -b 8, --per_device_train_batch_size 8,
        /// batch_size=8, ...).
        #[arg(long, value_name = "BATCH", value_parser = clap::value_parser!(u64).range(1..))]
        at: Option<u64>,
        /// The batches to show: a list (8,16,32) or a range with a step (8:64:8; 8:64 doubles).
        /// Default: the run's batch, 2x, 4x and 8x.
        #[arg(long, value_name = "LIST", value_parser = batches_arg)]
        batch: Option<Batches>,
        /// The device to fit: a size (24GiB, 40GB) or a GPU's name (l4, a100-40, h100, ...);
        /// what the CUDA context and libraries took in the run comes off it. Default: the
        /// run's device.
        #[arg(long, value_name = "SIZE|GPU", value_parser = device_arg)]
        device_memory: Option<u64>,
        /// Hold PyTorch's allocator to this many bytes, as
        /// torch.cuda.set_per_process_memory_fraction does (nothing comes off it).
        #[arg(long, value_name = "SIZE", value_parser = size_arg, conflicts_with = "device_memory")]
        limit: Option<u64>,
        /// The largest batch looked for.
        #[arg(long, value_name = "BATCH", default_value = "4096")]
        max_batch: u64,
        /// What-if: the run's repeated blocks under activation checkpointing
        /// (torch.utils.checkpoint, transformers' gradient_checkpointing_enable()), from this
        /// run without it: the blocks of a module class (GPT2Block, EncoderBlock, as the frames
        /// name it), or `auto` for the outermost class whose forward runs more than once a step.
        #[arg(long, value_name = "CLASS|auto", conflicts_with_all = ["with", "seq"])]
        checkpoint: Option<String>,
        /// How --checkpoint makes a block again: `reentrant` (torch.utils.checkpoint with
        /// use_reentrant=True: the block's forward whole, its backward a graph of its own) or
        /// `non-reentrant` (use_reentrant=False: up to its last saved tensor, each copy let go
        /// once used). Without it: reentrant for a block class of transformers' own (its
        /// gradient_checkpointing_enable()'s default), else non-reentrant.
        #[arg(long, value_name = "reentrant|non-reentrant", value_parser = ["reentrant", "non-reentrant"], requires = "checkpoint")]
        checkpoint_way: Option<String>,
        /// What-if: the forward under torch.autocast to 16 bits (bf16 or fp16: the same
        /// sizes), from this run in 32 bits: which ops then run in 16 bits, the copies autocast
        /// makes of their inputs and of the parameters, and the 16-bit gradients, from the
        /// autograd graph the shim records (docs/fit.md says where it can be wrong).
        #[arg(long, value_name = "bf16|fp16", conflicts_with_all = ["with", "seq", "checkpoint"])]
        autocast: Option<Autocast>,
        /// One rank of this data-parallel job at another world size (DDP, FSDP2, FSDP1 or
        /// DeepSpeed's ZeRO, from the frames): the shards of parameters, gradients and
        /// optimizer state resized to 1/N of the model, the rest kept; the batch per rank as
        /// the rows say. From a run on one GPU: DDP, and FSDP2 with the all-gather buffers it
        /// makes only at more ranks added; FSDP1 and ZeRO need a run of 2 ranks or more.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..), conflicts_with_all = ["with", "seq"])]
        world_size: Option<u64>,
        /// What-if: the run's model sharded over the ranks, from a run that keeps it whole
        /// (DDP, or one process with --world-size): `full` and `grad-op` as FSDP2 shards it
        /// (fully_shard on each repeated block and on the model), each block's gathered
        /// parameters let go after its forward (reshard_after_forward=True) or kept to its
        /// backward (False); `zero1`, `zero2` and `zero3` as DeepSpeed's ZeRO-1, ZeRO-2 and
        /// ZeRO-3 hold it (fp32, DeepSpeed's defaults; ZeRO-3 for a model of under 1e9
        /// elements). Over the run's world size, or --world-size N; one rank's rows (the run's
        /// rank), its batch.
        #[arg(long, value_name = "full|grad-op|zero1|zero2|zero3", conflicts_with_all = ["with", "seq", "checkpoint", "autocast"])]
        shard: Option<ShardWay>,
        /// With --shard zero1|zero2|zero3: the job's DeepSpeed `reduce_bucket_size` (elements of 4
        /// bytes), where its config sets one (DeepSpeed's default: 500000000).
        #[arg(long, value_name = "ELEMENTS", requires = "shard", value_parser = clap::value_parser!(u32).range(1..))]
        zero_bucket: Option<u32>,
        /// The run's own world size, where its trace does not say it (no WORLD_SIZE set).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..), requires = "world_size")]
        run_world_size: Option<u64>,
        /// A second run of the same program at another batch: each request then scales as
        /// the two runs show it (a line whose size does not follow the batch, or follows it
        /// only in part, comes out right), not as its kind says.
        #[arg(long = "with", value_name = "TRACE")]
        with: Option<PathBuf>,
        /// The second run's batch. Default: read from its command line.
        #[arg(long, value_name = "BATCH", requires = "with")]
        with_at: Option<u64>,
        /// The second run is at another sequence length (the same batch), this one: each
        /// request then follows the length as the two runs show it (not at all, in
        /// proportion, with its square as attention's scores do, or in part), and the peaks
        /// and the largest batch are given at the lengths --seq asks. Default, when --seq or
        /// --seq-at is given: read from its command line (--seq-len, --max_seq_length,
        /// --block_size, ...).
        #[arg(
            long,
            value_name = "LENGTH",
            requires = "with",
            conflicts_with = "with_at"
        )]
        with_seq: Option<u64>,
        /// The run's own sequence length. Default: read from its command line.
        #[arg(long, value_name = "LENGTH", requires = "with")]
        seq_at: Option<u64>,
        /// The sequence lengths to show, as --batch takes batches. Default: the run's, 2x and
        /// 4x.
        #[arg(long, value_name = "LIST", value_parser = batches_arg, requires = "with")]
        seq: Option<Batches>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        reading: Reading,
    },
    /// Analyse traces where they lie and save the analysis, for a job on many hosts: one step
    /// per host (srun, torchrun, ...) saves its ranks' analyses; summary, leaks, peak, oom and
    /// report then take the saved files in place of traces and join them into the job's.
    #[command(after_help = ANALYZE_HELP)]
    Analyze {
        /// This host's trace files.
        #[arg(required = true)]
        traces: Vec<PathBuf>,
        /// The file to save the analysis in (created private, 0600, and appearing whole).
        #[arg(short, long, required = true)]
        output: PathBuf,
        #[command(flatten)]
        reading: Reading,
    },
    /// The whole run in one HTML page that opens offline: memory over the run stacked by kind
    /// (parameters, gradients, optimizer state, activations, ...) or by line, the peak and
    /// every failed allocation marked, the lines that grow every iteration, the peak's holders
    /// and NVML's table beside it. Hover a band to read it, click it for its stacks; several
    /// traces (the ranks of a job) get a picker.
    #[command(
        after_help = "Examples:\n  gpushim report run.trace                 # writes run.html beside it\n  gpushim report rank*.trace -o job.html   # every rank, one page\n\n\
The x axis counts allocations and frees, so the start-up before the first allocation and the \
pauses between steps take no width, and iterations are marked on it; the page switches to \
time. The page holds its data: a trace of any length gives a page of a few hundred KB per \
device, and it opens with no network."
    )]
    Report {
        /// Trace files (the ranks of a job: one page, a picker between them).
        #[arg(required = true)]
        traces: Vec<PathBuf>,
        /// The batch the run used: the page draws the peak memory against the batch, the
        /// device's limit and the largest batch that fits (as `gpushim fit` finds them).
        #[arg(long, value_name = "BATCH", value_parser = clap::value_parser!(u64).range(1..))]
        at: Option<u64>,

        /// Output file, .html [default: beside the first trace, its name ending .html instead
        /// of .trace]. Written only into a folder that is yours alone (not one others can
        /// write): beside the trace when its folder is, else into the working folder, else
        /// nowhere (name one). The file is created private (0600) and appears whole.
        #[arg(short, long)]
        output: Option<PathBuf>,
        #[command(flatten)]
        reading: Reading,
    },
    /// Memory over the run as an SVG or PNG chart: stacked by the kinds of PyTorch's tensors
    /// (the default), by the lines that held most, or the totals over time.
    #[command(
        after_help = "--by kind and --by line draw one panel per device of each trace: \
the x axis counts allocations and frees, so start-up and pauses take no width, with the \
iterations marked on it; the peak is a dot, each failed allocation a red mark at the top. \
--by total draws live, reserved and NVML's memory over time, the traces of a job on one \
wall clock. `gpushim report` draws the same in a page you can hover and click.\n\n\
Examples:\n  gpushim plot run.trace                  # run.timeline.svg beside it\n  gpushim plot run.trace --by line -o lines.png"
    )]
    Plot {
        /// Trace files (the ranks of a job: a panel each, or one time axis with --by total).
        #[arg(required = true)]
        traces: Vec<PathBuf>,

        /// What the bands are: kind (parameters, gradients, activations, ...), line (the call
        /// sites that held most), or total (live, reserved and NVML's lines over time).
        #[arg(long, value_enum, default_value = "kind")]
        by: PlotBy,

        /// Output file: .svg, or .png for a picture [default: beside the first trace, its name
        /// ending .timeline.svg instead of .trace]. Written only into a
        /// folder that is yours alone (not one others can write): beside the trace when its folder
        /// is, else into the working folder, else nowhere (name one). Every file written is
        /// created private (0600) and appears whole.
        #[arg(short, long)]
        output: Option<PathBuf>,
        #[command(flatten)]
        reading: Reading,
    },
    /// A flame graph of the memory live at the peak, by stack: SVG, or PNG when the output
    /// ends in .png.
    #[command(
        after_help = "Examples:\n  gpushim flamegraph run.trace                 # run.flamegraph.svg beside it\n  gpushim flamegraph run.trace -o peak.png --color name"
    )]
    Flamegraph {
        /// The trace (Python frames are recorded by default; native stacks with
        /// GPUSHIM_CONF=stacks:on).
        trace: PathBuf,
        /// How frames are coloured: kind (the kind most of a frame's bytes are: parameters,
        /// activations, ...; PyTorch's tensors) or name (a warm hue from the frame's name).
        #[arg(long, value_enum, default_value = "kind")]
        color: FlameColor,
        /// Output file: .svg, or .png for a picture [default: beside the trace, its name
        /// ending .flamegraph.svg instead of .trace]. Written only into a
        /// folder that is yours alone (not one others can write): beside the trace when its folder
        /// is, else into the working folder, else nowhere (name one). Every file written is
        /// created private (0600) and appears whole.
        #[arg(short, long)]
        output: Option<PathBuf>,
        #[command(flatten)]
        reading: Reading,
    },
    /// Convert a trace for other viewers: Perfetto/Chrome JSON, PyTorch memory_viz pickle,
    /// RMM replay CSV.
    #[command(
        after_help = "Formats:\n  perfetto         Chrome trace JSON: open in https://ui.perfetto.dev (a counter track per device, NVTX ranges as slices;\n                   several traces become one timeline, a process per rank, aligned by wall clock)\n  memory-viz       PyTorch snapshot pickle: open in https://pytorch.org/memory_viz\n  rmm              RMM replay log: Thread,Time,Action,Pointer,Size,Stream\n\n\
        Examples:\n  gpushim export --format perfetto -o run.json rank*.trace\n  gpushim export --format memory-viz -o run.pickle run.trace\n\n\
        A page of the run that opens offline: `gpushim report`. For every record as CSV or JSON\n\
        lines: `gpushim events`."
    )]
    Export {
        /// One trace; for perfetto, several (one per rank) make one timeline.
        #[arg(required = true)]
        traces: Vec<PathBuf>,
        /// perfetto: Chrome/Perfetto JSON (ui.perfetto.dev); memory-viz: PyTorch's snapshot
        /// pickle (pytorch.org/memory_viz); rmm: RMM's replay CSV.
        #[arg(long, value_parser = export_formats())]
        format: String,
        /// Output file: created private (0600) and whole (written aside, then renamed into
        /// place); a link another user made at that name is replaced, never written through.
        #[arg(short, long)]
        output: PathBuf,
        /// Pickle protocol for memory-viz (2, 3 or 4).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(2..=4))]
        protocol: u8,
        /// memory-viz: the newest alloc/free events kept per device, as PyTorch's
        /// `_record_memory_history(max_entries=...)` keeps them (the segments and blocks live
        /// at the end are whole whatever it is). The viewer slows past some hundred thousand;
        /// each event kept costs memory here too.
        #[arg(long, default_value_t = 100_000)]
        max_entries: usize,
        #[command(flatten)]
        reading: Reading,
    },
    /// Watch a running process through its trace: live and peak memory per device and the
    /// call sites holding the most, refreshed until the process exits.
    #[command(
        after_help = "Example:\n  gpushim run --trace job.trace -- python train.py &\n  gpushim top job.trace\n\n\
        The first refresh reads the trace so far; each next one reads on from where the last\n\
        stopped, filters such as --device included. What the program wrote in the last 20 ms\n\
        shows at the next refresh."
    )]
    Top {
        /// The trace of the running process.
        trace: PathBuf,

        /// Time between refreshes: 2s, 500ms. The wait after a refresh is at least as long as
        /// its read took (the first reads the whole trace so far), so watching keeps the cores
        /// it reads with busy half the time at most.
        #[arg(long, default_value = "2s")]
        interval: String,
        /// Stop after this many refreshes (default: when the process exits).
        #[arg(long)]
        count: Option<u64>,
        /// Call sites to show.
        #[arg(long, default_value_t = 8)]
        top: usize,
        #[command(flatten)]
        reading: Reading,
    },
    /// Two traces side by side: peak, live at exit, and live bytes per call site.
    #[command(
        after_help = "Example:\n  gpushim diff before.trace after.trace   # what a change did to the peak and each line"
    )]
    Diff {
        /// The first trace (the baseline).
        a: PathBuf,
        /// The second trace.
        b: PathBuf,

        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        reading: Reading,
    },
    /// Print the path of the shim library that `gpushim run` preloads (for LD_PRELOAD by hand,
    /// or PyTorch's pluggable allocator). An installed wheel writes its bundled copy out first,
    /// into a folder of the user's alone: $XDG_CACHE_HOME/gpushim, else ~/.cache/gpushim, else
    /// $XDG_RUNTIME_DIR/gpushim.
    #[command(after_help = "Example:\n  LD_PRELOAD=$(gpushim lib) python train.py")]
    Lib {
        /// The shim library to check instead of the one found.
        #[arg(long, value_name = "PATH")]
        lib: Option<PathBuf>,
        /// Print instead the fingerprint of the sources the shim this command carries was built
        /// from (an installed wheel's), to compare with a checkout's.
        #[arg(long)]
        sources: bool,
    },
    /// Print the effective configuration from GPUSHIM_CONF and what each key does.
    #[command(
        after_help = "Examples:\n  gpushim config\n  gpushim config pool:caching,limit:24GiB   # check a setting before a run"
    )]
    Config {
        /// Configuration to check instead of $GPUSHIM_CONF.
        conf: Option<String>,
    },
}

impl Cmd {
    /// The finished traces the command reads (not `top`'s, which may still be written).
    pub fn trace_paths(&self) -> Vec<PathBuf> {
        match self {
            Cmd::Summary { traces, .. }
            | Cmd::Leaks { traces, .. }
            | Cmd::Peak { traces, .. }
            | Cmd::Oom { traces, .. }
            | Cmd::Plot { traces, .. }
            | Cmd::Report { traces, .. }
            | Cmd::Analyze { traces, .. }
            | Cmd::Simulate { traces, .. }
            | Cmd::Export { traces, .. } => traces.clone(),
            Cmd::Events { trace, .. } | Cmd::Flamegraph { trace, .. } => {
                vec![trace.clone()]
            }
            Cmd::Fit { traces, .. } => traces.clone(),
            Cmd::Diff { a, b, .. } => vec![a.clone(), b.clone()],
            Cmd::Top { .. } | Cmd::Run { .. } | Cmd::Config { .. } | Cmd::Lib { .. } => Vec::new(),
        }
    }

    /// Whether the command reads every trace it names by the analysis, which refuses a filter
    /// that keeps no allocation once its pass has read the trace; the others' filters are
    /// checked by a read of their own first.
    pub fn checks_filter_as_it_reads(&self) -> bool {
        matches!(
            self,
            Cmd::Summary { .. }
                | Cmd::Leaks { .. }
                | Cmd::Peak { .. }
                | Cmd::Oom { .. }
                | Cmd::Plot { .. }
                | Cmd::Report { .. }
                | Cmd::Analyze { .. }
                | Cmd::Diff { .. }
        )
    }

    /// The reading options of a report command.
    pub fn reading(&self) -> Option<&Reading> {
        match self {
            Cmd::Summary { reading, .. }
            | Cmd::Simulate { reading, .. }
            | Cmd::Events { reading, .. }
            | Cmd::Leaks { reading, .. }
            | Cmd::Peak { reading, .. }
            | Cmd::Oom { reading, .. }
            | Cmd::Plot { reading, .. }
            | Cmd::Report { reading, .. }
            | Cmd::Analyze { reading, .. }
            | Cmd::Fit { reading, .. }
            | Cmd::Flamegraph { reading, .. }
            | Cmd::Export { reading, .. }
            | Cmd::Top { reading, .. }
            | Cmd::Diff { reading, .. } => Some(reading),
            Cmd::Run { .. } | Cmd::Config { .. } | Cmd::Lib { .. } => None,
        }
    }
}
