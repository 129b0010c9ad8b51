"""As DDP (torch/nn/parallel/distributed.py): the gradient buckets are made when it is built
(`_ddp_init_helper`) and made again before the second step's forward (`_pre_forward` rebuilds
them, the first let go). With gradient_as_bucket_view the parameters' gradients are views of
them, so the backward keeps no gradient of its own; without it (the default) the backward's
gradients stand beside the buckets, which are DDP's own buffers (the program's job.py makes
those gradients). At a world of one the first buckets are let go only after the second step's
backward, the rebuilt ones made beside them. At two ranks or more real DDP lets them go before
the rebuilt ones are made or as late as at one, as its collectives on NCCL's stream complete
(traces of DDP on H200s show both); here before, or late with DDP_BUCKETS_LATE set. With
DDP_SYNC_STATES=BYTES it first broadcasts the module's states as real DDP does: one buffer of
BYTES (real DDP's holds the parameters and buffers, to 250 MiB), made and let go in
torch/distributed/utils.py (DDP_SYNC_ELSEWHERE: by a function of a name the frames do not
know)."""
import os

from torch import _standin


class DistributedDataParallel:
    def __init__(self, module, bucket_bytes, world=2):
        self.module = module
        self.bucket_bytes = bucket_bytes
        self.world = world
        self.steps = 0
        self.stale = None
        if os.environ.get("DDP_SYNC_STATES"):
            from torch.distributed import utils

            sync = utils._sync_module_states
            if os.environ.get("DDP_SYNC_ELSEWHERE"):
                sync = utils._broadcast_states_elsewhere
            sync(int(os.environ["DDP_SYNC_STATES"]))
        self.buckets = self._ddp_init_helper()

    def _ddp_init_helper(self):
        return _standin._lib.standin_malloc(self.bucket_bytes)

    def _pre_forward(self):
        if self.steps == 1:
            if self.world == 1 or os.environ.get("DDP_BUCKETS_LATE"):
                self.stale = self.buckets
            else:
                _standin.free(self.buckets)
            self.buckets = _standin._lib.standin_malloc(self.bucket_bytes)
        self.steps += 1

    def _backward_done(self):
        """The step's backward is over: at a world of one, the first buckets let go now."""
        if self.stale is not None:
            _standin.free(self.stale)
            self.stale = None

    def forward(self, x, saved):
        self._pre_forward()
        return self.module(x, saved)

    def __call__(self, x, saved):
        return self.forward(x, saved)
