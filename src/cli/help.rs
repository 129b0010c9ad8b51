//! The longer help texts of `fit` and `simulate`: their examples and what they assume.

pub(super) const FIT_HELP: &str = "Examples:\n  gpushim fit run.trace                             # the batch from the run's --batch-size\n  gpushim fit run.trace --at 8                      # 8, 16, 32, 64 and the largest that fits\n  gpushim fit run.trace --at 8 --device-memory l4   # will it fit a 24 GB L4?\n  gpushim fit run.trace --at 8 --batch 8:128        # 8, 16, 32, 64, 128\n  gpushim fit run.trace --at 2 --checkpoint auto    # with the repeated blocks checkpointed\n  gpushim fit run.trace --at 2 --autocast bf16      # a run in fp32, as under bf16 autocast\n  gpushim fit r.0.trace --at 4 --world-size 8       # one rank of the job at 8 ranks\n  gpushim fit r.0.trace --at 4 --shard full         # a DDP job's rank, its model sharded as FSDP2 does\n  gpushim fit --at 4 r.*.trace                      # every rank, and the one that fails first\n  gpushim fit s512.trace --at 8 --with s1024.trace --seq-at 512 --with-seq 1024 --seq 2048,4096\n                                                    # at sequence lengths 2048 and 4096\n\n\
Activations, the input and the temporaries of the forward and the backward grow with the \
batch; parameters, gradients, optimizer state, cuBLAS's workspaces and the optimizer's \
temporaries do not (the kinds: docs/kinds.md). The run's requests, so resized, are replayed \
through the model of PyTorch's allocator under the run's setting and with expandable segments \
switched, as `simulate --torch` does; a batch fits when no request fails. Tensors of unknown \
kind keep their size, and their lines are named. How, and where it can be wrong: docs/fit.md.";

pub(super) const SIMULATE_HELP: &str = "Examples:\n  gpushim simulate run.trace --torch expandable_segments:True \\\n    --torch max_split_size_mb:128\n  gpushim simulate run.trace --recommend\n  gpushim simulate run.trace --conf pool:caching --conf pool:caching,max_split:64MiB\n\n\
--torch replays the tensors PyTorch's caching allocator handed out (recorded by default) \
through a model of that allocator (docs/torch-allocator.md). The setting the run used (kept in \
the trace) is replayed first and compared with the segments the run really took: when they \
match, the other rows are what those settings would have reserved for the same program. \
CUDA graphs' pools and torch.cuda.MemPool are kept as the run held them (torch 2.8 on), \
counted against the device and the memory fraction, not replayed under the other setting.\n\n\
--conf replays the allocation calls through the shim's own pool. That replay assumes the GPU \
keeps up with the program, so it shows the memory a policy needs, not the waits it would cost.";

pub(super) const ANALYZE_HELP: &str = "Examples:\n  # each host analyses its own ranks' traces, beside them, one core per trace:\n  srun --ntasks-per-node=1 sh -c 'gpushim analyze /local/traces/*.trace -o /shared/job/$(hostname).analysis'\n  # then, anywhere, the job's reports from the saved analyses:\n  gpushim summary /shared/job/*.analysis\n  gpushim leaks /shared/job/*.analysis\n  gpushim report /shared/job/*.analysis -o job.html\n\n\
A saved analysis holds every report the page shows, as this host made them (a few hundred KB \
per trace, whatever the trace's length): summary, leaks, peak and oom read it as they read a \
trace, naming each trace HOST:TRACE. Filters (--device, --from, ...) apply when saving; \
--boundary, fit and the page's what-fits curve need the traces themselves.";
