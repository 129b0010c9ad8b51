"""A model of repeated blocks on the stand-ins for PyTorch (tests/fit_checkpoint.rs), run as
it is or with each block checkpointed, as torch.utils.checkpoint runs it: what `gpushim fit
--checkpoint` predicts from the plain run, this program does when asked.

Per step: a batch; BLOCKS blocks of three ops, each op a temporary (freed once its output is
made) and an output made by an autograd node (saved for the backward; the third op's is the
block's output, the next block's input); a loss; the backward, block by block in reverse, op by
op: the node's gradient on the engine thread, then the op's saved output freed, the previous
gradient freed; an optimizer step (its state made at the first).

Checkpointed (`ckpt`, as `torch.utils.checkpoint(use_reentrant=False)`): the forward keeps
nothing for the backward, each op's input freed once the next op has made its temporary (as it
is under no_grad, when nothing else holds it); the block's output is kept. The backward of each
block first runs the block's forward again up to its last saved tensor (the second op's output:
PyTorch's early stop), then runs the backward as above on what it made, each copy let go as
soon as its node returns (before the engine's reduction, below). BLOCKS_TRANSFORMERS set: the
block's forward is named as a file of transformers', and `ckpt` is reentrant, as transformers'
`gradient_checkpointing_enable()` checkpoints by default: the block's forward again whole, the
copy of its output freed at once, each copy let go as the run's own was.

BLOCKS_REDUCE set: the backward of each block's first two ops (those with a bias) ends with the
engine's reduction of a gradient to its input's shape (a bias's: its result, here a weight's
size, then a staging buffer of 4.5 MiB a sample and its semaphore, both freed at once, then the
result), after which the node's saved output is let go.

BLOCKS_INPUTS set (not with BLOCKS_REDUCE): each op's node saves its input, the previous op's
output, as PyTorch's matmul does, and lets go of it in the backward (the block's last op its
own output too); checkpointed, an op's input is freed once the op has made its output.

Under autocast (`amp`, not with `ckpt`): each op first makes its weight's 16-bit copy (half
the weight, by a cast's node, ToCopyBackward0), kept for the backward with the op's output;
its backward, after the op's, makes the weight's gradient cast back (the weight's size, freed
at once) and frees the copy. `amp-grads` is PyTorch's own order: each op first casts its input
too (a copy of half a weight's size a sample, kept for the backward, whose backward hands a
gradient of twice that on, freed at once), and the weight's gradient cast back is the weight's
`.grad` until the optimizer's step (`zero_grad()` setting it to None after). `amp-full` is
`amp-grads` with the 16-bit gradients of each op's backward as PyTorch makes them: the op's
node makes its input's gradient and its weight's, both 16-bit and half a weight's size at batch
1, each let go once its cast's node has cast it back (the weight's becoming its `.grad`).
`amp-temps` is `amp-full` whose forward ends with six temporaries of its last op at once
(made after its node, as PyTorch's kernels make theirs), half a weight's size a sample.

`amp-summed` is `amp` summing into `.grad` kept from step to step: the first step's cast-back
gradients are the weights' `.grad` for the whole run, later ones are summed into them and let
go at once.

`grads` (fp32, no autocast): each op's backward makes its weight's gradient (the weight's
`.grad` until the optimizer's step) and its input's, a weight's size a sample, handed on to the
op before (let go once that op's node has made its own).

`ddp` is `grads` under DDP: its gradient buckets (the model's size) made when it is built and
again before the second step (torch/nn/parallel/distributed.py's stand-in). `fsdp2` is `grads`
with each block given to FSDP2's `fully_shard` (torch/distributed/fsdp/_fully_shard/'s
stand-in): each weight a shard (1/WORLD_SIZE, default 2) and the optimizer's state and
temporaries too; each block's weight gathered before its forward and let go after it, gathered
again before its backward, its gradients reduce-scattered after it (the shard kept as its
gradient until the optimizer's step); `fsdp2-keep` keeps the gathered weight from the forward to
the backward (reshard_after_forward=False). What `gpushim fit --shard full|grad-op` predicts
from the `ddp` run. BLOCKS_ROW=BYTES: a module of its own before the blocks holds
a parameter of first dimension 1 (a position embedding's shape) of that many bytes, given to
`fully_shard` after the blocks: FSDP2 keeps its one row whole on every rank; its op's output
is made after it is gathered, its gradient before its reduce-scatter. Under `ddp` the row is
added to the input, broadcast over the batch (an AddBackward0 node, whose backward makes the
row's gradient, kept to the optimizer's step). BLOCKS_MP=1 (FSDP2 only):
mixed precision's casts, the root's input cast to 16 bits (half its bytes, kept to the step's
end) and each all-gather's inputs (the shards cast, half their bytes), and each weight's
gradient 16-bit (half its size; reduce-scattered in fp32); the gathered weights kept as they
are.

`zero2` is `grads` with the weights held as DeepSpeed's ZeRO-2 holds them on rank 0 of
WORLD_SIZE (runtime/zero/stage_1_and_2.py, fp32, in the order its code makes its requests, as
traces of it on an H200 show): the weights flattened into one buffer and let go, the fp32
master copy of the rank's partition and a zeroed gradient of it let go at once; in each
backward, the gradient bucket (ZERO_BUCKET bytes, default 4 MiB) made at the first gradient's
hook, each gradient let go at its hook (once its node is done), the bucket's gradients
flattened and the partition's gradients made (every weight reaching into the partition,
whole) where the bucket would overflow and at the backward's end, the bucket let go; in each
step, the norm (twice each of the partition's weights' bytes there, one at a time), the
partition's fp32 gradient made and the partition's gradients let go, the client optimizer's
step on the master copy (one state and one temporary of the partition's size per line), the
fp32 gradient let go. What `gpushim fit --shard zero2 --zero-bucket` predicts from the `ddp`
run.

`zero3` is `grads` as DeepSpeed's ZeRO-3 holds the weights on rank 0 of WORLD_SIZE
(runtime/zero/stage3.py, fp32, its defaults): the weights let go, each one's partition (its
elements over the world, rounded up) in one flat buffer, the fp32 master copy of it and a
zeroed copy let go at once, the gradient bucket (ZERO_BUCKET bytes) and the partition's
gradients kept for the run, each weight gathered whole and let go, one at a time; each forward,
after the batch, a flat buffer of every weight gathered on a stream of its own and each weight
copied whole out of it (the flat buffer let go at the forward's end); each gradient let go
into the bucket at its hook with the gathered weight of its size (the latest), the bucket's
gradients copied once (DeepSpeed's post-scaling, on its reduce stream) where it would overflow
and at the backward's end, the weights left let go then; each step, ZeRO-2's norm, fp32
gradient and client optimizer. What `gpushim fit --shard zero3 --zero-bucket` predicts.

usage: blocks.py LIBTORCH_CPU LIBC10_CUDA STEPS
                 [ckpt|amp|amp-grads|amp-full|amp-temps|amp-summed|grads|ddp|fsdp2|fsdp2-keep|zero2|zero3]
                 [--batch-size N]
BLOCKS_COUNT=N: N blocks (default 4). BLOCKS_WEIGHT=BYTES: each block's weight (default 1 MiB;
its gradients and optimizer state keep their sizes). BLOCKS_TEMPS=0: the ops make no temporary, so nothing
the block makes is freed inside it (checkpointed, each op's input is freed once its output is
made). BLOCKS_LOCAL set: the block's forward named as a class defined inside a function's is
(`build.<locals>.Block.forward`). BLOCKS_STACKS set: the same requests made in two stacks of
blocks (as an encoder-decoder runs its two: `Stack.forward` makes an embedding's temporary, calls
half the blocks, then makes a norm's), a block's first two ops made inside a layer of its
own (`Layer.forward` calling `Proj.forward`), its last in its own forward; BLOCKS_STACKS=2:
the second stack's blocks' weights half as large again (a decoder's blocks); BLOCKS_STACKS=3:
a weight of 1 MiB per op (the size of its weight gradient), and the second stack's blocks an
op more, with its weight (two makes of block whose parameters are all of one size); with
BLOCKS_BUFFERS set, each weight followed by two buffers that take no gradient (a norm's)."""
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

batch = 1
if "--batch-size" in sys.argv[:-1]:
    batch = int(sys.argv[sys.argv.index("--batch-size") + 1])
    os.environ["KINDS_BATCH"] = str(batch)

from torch import _standin  # noqa: E402

_standin.load(sys.argv[1], sys.argv[2])

from torch.nn.modules.linear import Linear  # noqa: E402
from torch.nn.modules.module import Module  # noqa: E402
from torch.optim.adam import Adam  # noqa: E402

KiB = 1 << 10
MiB = 1 << 20
BLOCKS = int(os.environ.get("BLOCKS_COUNT", "4"))
ROW = int(os.environ.get("BLOCKS_ROW", "0"))
WEIGHT = int(os.environ.get("BLOCKS_WEIGHT", str(1 * MiB)))
TEMPS = os.environ.get("BLOCKS_TEMPS", "1") != "0"
TWO_MAKES = os.environ.get("BLOCKS_STACKS") == "3"
BUFFERS = bool(os.environ.get("BLOCKS_BUFFERS"))
steps = int(sys.argv[3])
reentrant = bool(os.environ.get("BLOCKS_TRANSFORMERS"))
ckpt = "ckpt" in sys.argv[4:]
REDUCE = bool(os.environ.get("BLOCKS_REDUCE"))
INPUTS = bool(os.environ.get("BLOCKS_INPUTS"))
ddp = "ddp" in sys.argv[4:]
reshard = "fsdp2" in sys.argv[4:]
fsdp2 = reshard or "fsdp2-keep" in sys.argv[4:]
world = int(os.environ.get("WORLD_SIZE", "2"))
zero3 = "zero3" in sys.argv[4:]
zero = "zero2" in sys.argv[4:] or zero3
handed = "grads" in sys.argv[4:] or ddp or fsdp2 or zero
summed = "amp-summed" in sys.argv[4:]
temps = "amp-temps" in sys.argv[4:]
full = "amp-full" in sys.argv[4:] or temps
grads = "amp-grads" in sys.argv[4:] or full
amp = "amp" in sys.argv[4:] or grads or summed
assert not (ckpt and amp), "ckpt or amp, not both"

autograd = ctypes.CDLL(sys.argv[1])
autograd.standin_forward_mm.restype = ctypes.c_void_p
autograd.standin_forward_mm.argtypes = (ctypes.c_size_t,)
autograd.standin_forward_op.restype = ctypes.c_void_p
autograd.standin_forward_op.argtypes = (ctypes.c_int, ctypes.c_size_t)
autograd.standin_forward_cast.restype = ctypes.c_void_p
autograd.standin_forward_cast.argtypes = (ctypes.c_size_t,)
autograd.standin_backward_node.restype = ctypes.c_void_p
autograd.standin_backward_node.argtypes = (ctypes.c_size_t, ctypes.c_size_t)
nodes = 0  # nodes made so far: the next one's index
casts = set()  # the indices of the weights' casts' nodes
input_casts = set()  # the indices of the inputs' casts' nodes
kept_grads = []  # the weights' gradients until the optimizer's step
sixteen = {}  # `amp-full`: each cast's node index -> the 16-bit gradient it casts back
dot_grad = []  # `amp-summed`: the weights' `.grad`, made at the first step, for the run
step_now = 0


def op_output(n, cast=False, cast_input=False):
    """An op's output, made by a new autograd node (a cast's if `cast` or `cast_input`): (its
    node's index, the tensor)."""
    global nodes
    made = autograd.standin_forward_cast if cast or cast_input else autograd.standin_forward_mm
    p = made(n)
    assert p, "out of memory"
    if cast:
        casts.add(nodes)
    if cast_input:
        input_casts.add(nodes)
    nodes += 1
    return nodes - 1, p


def add_output(n):
    """An add's output of `n` bytes, made by a new AddBackward0 node: (its node's index, the
    tensor)."""
    global nodes
    p = autograd.standin_forward_op(2, n)
    assert p, "out of memory"
    nodes += 1
    return nodes - 1, p


class Block(Module):
    def __init__(self, weight=WEIGHT, ops=3):
        self.weight_bytes = weight
        self.ops = ops
        if TWO_MAKES:
            # A weight per op, each the size of the op's weight gradient (1 MiB); BLOCKS_BUFFERS
            # set: each followed by buffers that take no gradient (a norm's running statistic,
            # of the op's place times 64 KiB, and its count of batches).
            self.weight_bytes = 1 * MiB
            self.weights, self.buffers = [], []
            for k in range(ops):
                self.weights.append(_standin.empty(self.weight_bytes))
                if BUFFERS:
                    self.buffers += [_standin.empty((k + 1) * 64 * KiB), _standin.empty(512)]
        else:
            self.weight = _standin.empty(self.weight_bytes)
        self.grad = None

    def op(self, size, outs, keep):
        if grads:
            outs.append(op_output(512 * KiB * batch, cast_input=True))  # the input's copy
        if amp:
            outs.append(op_output(512 * KiB, cast=True))  # the weight's copy
        if full:
            outs.append(op_output(size * batch))
            return
        if not TEMPS:
            used = outs[-1][1] if not keep and outs else None
            outs.append(op_output(size * batch))
            if used is not None:
                _standin.free(used)  # the previous op's output: used, not kept
            return
        t = _standin.empty(128 * KiB * batch)
        used = outs[-1][1] if not keep and outs else None
        if used is not None and not INPUTS:
            _standin.free(used)  # the previous op's output: used, not kept
        outs.append(op_output(size * batch))
        if used is not None and INPUTS:
            _standin.free(used)  # used by this op until its output was made
        _standin.free(t)

    def forward(self, x, saved, keep, ops=None):
        # Three ops (four in a block of the second make), each from a line of its own (as a
        # block's forward reads: no loop); the first `ops` of them (a non-reentrant
        # checkpoint's early stop).
        ops = self.ops if ops is None else ops
        outs = []
        op = LAYER if STACKS else Block.op
        op(self, 768 * KiB, outs, keep)
        if ops > 1:
            op(self, 512 * KiB, outs, keep)
        if ops > 2:
            self.op(256 * KiB, outs, keep)
        if ops > 3:
            self.op(128 * KiB, outs, keep)
        if keep:
            saved.extend(outs)
        else:
            saved.append(outs[-1])  # the block's output, the next one's input
        return outs[-1][1]


if reentrant:
    # A block of transformers' own, as its file names it.
    code = Block.forward.__code__.replace(
        co_filename="/site-packages/transformers/models/blocks/modeling_blocks.py")
    Block.forward = type(Block.forward)(
        code, Block.forward.__globals__, "forward", Block.forward.__defaults__)

if os.environ.get("BLOCKS_LOCAL"):
    # As a class defined inside a function: its forward's qualified name is
    # `build.<locals>.Block.forward` (the frames' function name, from Python 3.11).
    import types

    code = Block.forward.__code__.replace(co_qualname="build.<locals>.Block.forward")
    Block.forward = types.FunctionType(
        code, Block.forward.__globals__, "forward", Block.forward.__defaults__)


STACKS = bool(os.environ.get("BLOCKS_STACKS"))


class Proj(Module):
    """A layer's innermost module (as a linear map is)."""

    def forward(self, block, size, outs, keep):
        block.op(size, outs, keep)


class Layer(Module):
    """A layer of a block (as an attention or an MLP is): it calls a module of its own."""

    def __init__(self):
        self.proj = Proj()

    def forward(self, block, size, outs, keep):
        self.proj(block, size, outs, keep)


LAYER = Layer()


class Stack(Module):
    """Blocks run one after another (as an encoder's or a decoder's are)."""

    def __init__(self, first, blocks):
        self.first, self.blocks = first, blocks

    def forward(self, x, per_block, keep):
        embedded = _standin.empty(64 * KiB * batch)  # the stack's embedding, made and used
        _standin.free(embedded)
        for k, b in enumerate(self.blocks):
            x = run_block(self.first + k, b, x, per_block, keep)
        norm = _standin.empty(64 * KiB * batch)  # the stack's last norm, made and used
        _standin.free(norm)
        return x


def run_block(k, b, x, per_block, keep):
    saved = []
    if fsdp2:
        groups[k].pre_forward()
    x = b(x, saved, keep)
    if reshard:
        groups[k].reshard()
    per_block.append(saved)
    return x


class Row(Module):
    """A module whose one parameter has a first dimension of 1 (BLOCKS_ROW)."""

    def __init__(self):
        self.row_bytes = ROW
        self.row = _standin.empty(ROW)


class Net(Module):
    def __init__(self):
        # BLOCKS_STACKS=2: the second stack's blocks weigh half as much again (a decoder's
        # blocks, which attend to the encoder too); =3: they have an op more, with its weight.
        second = WEIGHT * 3 // 2 if os.environ.get("BLOCKS_STACKS") == "2" else WEIGHT
        ops = 4 if TWO_MAKES else 3
        self.blocks = [
            Block(WEIGHT, 3) if k < BLOCKS // 2 else Block(second, ops) for k in range(BLOCKS)
        ]

    def forward(self, x, per_block, keep):
        if STACKS:
            half = len(self.blocks) // 2
            for first, blocks in ((0, self.blocks[:half]), (half, self.blocks[half:])):
                x = Stack(first, blocks)(x, per_block, keep)
        else:
            for k, b in enumerate(self.blocks):
                x = run_block(k, b, x, per_block, keep)
        if temps:
            # The forward's last op's temporaries, half a weight's size a sample, six at once
            # (the most the forward holds).
            held = [_standin.empty(512 * KiB * batch) for _ in range(6)]
            for t in held:
                _standin.free(t)
        return x


passed = None  # `grads`: the input's gradient handed to the op before
hooked = []  # `zero2`: the weights' gradients whose node has not yet returned


class Zero:
    """DeepSpeed's ZeRO-2 on rank 0 of `world`, as the module's comment says."""

    def __init__(self, blocks, world, bucket_bytes):
        sizes = [b.weight_bytes for b in blocks]
        align = 8 * world  # 2 x world fp32 elements
        flat_bytes = -(-sum(sizes) // align) * align
        self.flat = _standin.empty(flat_bytes)
        for b in blocks:
            _standin.free(b.weight)
        self.part = flat_bytes // world
        self.master = _standin.empty(self.part)
        _standin.free(_standin.empty(self.part))  # the zeroed gradient of the partition
        self.norms, self.whole, offset = [], 0, 0
        for size in sizes:
            if offset < self.part:
                self.norms.append(min(offset + size, self.part) - offset)
                self.whole += size
            offset += size
        self.bucket_bytes, self.bucket, self.held = bucket_bytes, None, 0
        self.grads_in_partition = None
        # The client optimizer on the one master tensor: each line's state and temporary of
        # the partition's size (the blocks' Adam makes 2 MiB of state and a 1 MiB temporary
        # for each of its weights).
        self.opt = Adam([self.master], 2 * len(blocks) * MiB // world, len(blocks) * MiB // world)

    def hook(self, grad, size):
        if self.bucket is None:
            self.bucket = _standin.empty(self.bucket_bytes)
        if self.held and self.held + size > self.bucket_bytes:
            self.reduce()
        self.held += size
        _standin.free(grad)

    def reduce(self):
        if self.held:
            _standin.free(_standin.empty(self.held))  # the bucket's gradients flattened
        if self.grads_in_partition is None:
            self.grads_in_partition = _standin.empty(self.whole)
        self.held = 0

    def backward_end(self):
        if self.bucket is not None:
            self.reduce()
            _standin.free(self.bucket)
            self.bucket = None

    def step(self):
        for n in self.norms:
            _standin.free(_standin.empty(2 * n))  # fp64, one weight at a time
        fp32 = _standin.empty(self.part)
        if self.grads_in_partition is not None:
            _standin.free(self.grads_in_partition)
            self.grads_in_partition = None
        self.opt.step()
        _standin.free(fp32)


GATHER_STREAM = 0x5A03
REDUCE_STREAM = 0x5A04


def on(stream, n):
    """A tensor of `n` bytes on `stream`."""
    _standin._lib.standin_use_stream(stream)
    try:
        return _standin.empty(n)
    finally:
        _standin._lib.standin_use_stream(0)


class Zero3:
    """DeepSpeed's ZeRO-3 on rank 0 of `world`, as the module's comment says."""

    def __init__(self, blocks, world, bucket_bytes):
        self.sizes = [b.weight_bytes for b in blocks]
        for b in blocks:
            _standin.free(b.weight)
        self.norms = [-(-(size // 4) // world) * 4 for size in self.sizes]
        self.part = sum(self.norms)
        self.flat = _standin.empty(self.part)
        self.master = _standin.empty(self.part)
        _standin.free(_standin.empty(self.part))
        self.bucket = _standin.empty(bucket_bytes)
        self.grads = _standin.empty(self.part)
        for size in self.sizes:
            _standin.free(_standin.empty(size))  # gathered whole, one at a time
        self.world, self.bucket_bytes, self.held = world, bucket_bytes, 0
        self.copies, self.gathered = [], None
        self.opt = Adam([self.master], 2 * len(blocks) * MiB // world, len(blocks) * MiB // world)

    def gather(self):
        self.gathered = on(GATHER_STREAM, sum(n * self.world for n in self.norms))
        self.copies = [(size, on(GATHER_STREAM, size)) for size in self.sizes]

    def forward_end(self):
        _standin.free(self.gathered)

    def post_scale(self):
        if self.held:
            _standin.free(on(REDUCE_STREAM, self.held))
        self.held = 0

    def hook(self, grad, size):
        if self.held and self.held + size > self.bucket_bytes:
            self.post_scale()
        self.held += size
        _standin.free(grad)
        same = [k for k, (s, _) in enumerate(self.copies) if s == size]
        if same:
            _standin.free(self.copies.pop(same[-1])[1])

    def backward_end(self):
        self.post_scale()
        for _, copy in self.copies:
            _standin.free(copy)
        self.copies = []

    def step(self):
        for n in self.norms:
            _standin.free(_standin.empty(2 * n))  # fp64, one weight at a time
        fp32 = _standin.empty(self.part)
        self.opt.step()
        _standin.free(fp32)


def run_hooks():
    """`zero2`: the hooks of the gradients whose node returned."""
    for g in hooked:
        zopt.hook(g, 1 * MiB)
    hooked.clear()


def backward_ops(ops, grad_bytes, first=False, copies=()):
    """The backward of a block's ops, in reverse: each node's gradient, then its saved output
    freed, then the previous gradient. `first`: the model's first block, whose first op's
    input (the batch) takes no gradient. `copies`: saved outputs a non-reentrant checkpoint
    made again, let go as soon as their node returns."""
    global passed
    prev = None
    first_op = min(node for node, _ in ops) if first else None
    for pos, (node, out) in reversed(list(enumerate(ops))):
        if zero:
            run_hooks()  # the node before returned: its gradients' hooks run
        if amp and node in casts:
            # The weight's gradient cast back to its size: summed into .grad at once, or the
            # weight's .grad until the optimizer's step.
            g = autograd.standin_backward_node(node, 1 * MiB)
            assert g, "out of memory"
            if grads:
                kept_grads.append(g)
            elif summed and step_now == 0:
                dot_grad.append(g)  # the first step's: the weight's `.grad` from now on
            else:
                _standin.free(g)
            if node in sixteen:
                _standin.free(sixteen.pop(node))
            _standin.free(out)
            continue
        if node in input_casts:
            # The input's gradient cast back, handed on to the op before.
            g = autograd.standin_backward_node(node, 1 * MiB * batch)
            assert g, "out of memory"
            _standin.free(g)
            if node in sixteen:
                _standin.free(sixteen.pop(node))
            _standin.free(out)
            continue
        g = autograd.standin_backward_node(node, grad_bytes)
        assert g, "out of memory"
        if passed is not None:
            _standin.free(passed)
            passed = None
        if handed:
            # Under FSDP2's mixed precision (BLOCKS_MP) the weight's gradient is 16-bit: half.
            w = autograd.standin_backward_node(node, 1 * MiB // (2 if fsdp2 and MP else 1))
            assert w, "out of memory"
            (hooked if zero else kept_grads).append(w)
            if node != first_op:
                passed = autograd.standin_backward_node(node, 1 * MiB * batch)
                assert passed, "out of memory"
        if full:
            # The op's own 16-bit gradients, for its two casts (made just before it, the
            # weight's last) to cast back.
            for cast, size in ((node - 1, 512 * KiB), (node - 2, 512 * KiB * batch)):
                sixteen[cast] = autograd.standin_backward_node(node, size)
                assert sixteen[cast], "out of memory"
        if REDUCE and pos < 2:
            if out in copies:
                _standin.free(out)  # the node returned: the copy goes
            result = autograd.standin_backward_node(node, 1 * MiB)
            staging = autograd.standin_backward_node(node, 4608 * KiB * batch)
            semaphore = autograd.standin_backward_node(node, 288 * batch)
            assert result and staging and semaphore, "out of memory"
            _standin.free(semaphore)
            _standin.free(staging)
            _standin.free(result)
        if INPUTS:
            # The node let go of what it saved: its input, the previous op's output (the
            # block's last op, the block's output too).
            if pos > 0:
                _standin.free(ops[pos - 1][1])
            if pos == len(ops) - 1:
                _standin.free(out)
        elif not (REDUCE and pos < 2 and out in copies):
            _standin.free(out)
        if prev is not None:
            _standin.free(prev)
        prev = g
    _standin.free(prev)


row_module = Row() if (fsdp2 or ddp) and ROW else None
model = Net()
if ddp:
    from torch.nn.parallel.distributed import DistributedDataParallel  # noqa: E402

    wrapped = DistributedDataParallel(model, BLOCKS * MiB)
MP = bool(os.environ.get("BLOCKS_MP"))
if fsdp2:
    from torch.distributed.fsdp._fully_shard import _fsdp_common, _fsdp_param_group  # noqa: E402

    groups = [_fsdp_param_group.fully_shard(b, world) for b in model.blocks]
    row_group = _fsdp_param_group.fully_shard(row_module, world) if row_module else None
    opt = Adam(model.blocks, 2 * MiB // world, 1 * MiB // world)
elif zero:
    bucket = int(os.environ.get("ZERO_BUCKET", str(4 * MiB)))
    zopt = (Zero3 if zero3 else Zero)(model.blocks, world, bucket)
    opt = zopt
else:
    opt = Adam(model.blocks, 2 * MiB)
shards = []  # fsdp2: each block's shard of its gradients, until the optimizer's step
for step in range(steps):
    step_now = step
    x = _standin.empty(1 * MiB * batch)
    # FSDP2 under mixed precision (BLOCKS_MP): the root casts its input to 16 bits.
    cast_x = _fsdp_common._cast_fp_tensor(1 * MiB * batch) if fsdp2 and MP else None
    if zero3:
        zopt.gather()
    if ddp:
        wrapped._pre_forward()
    per_block = []
    if row_module and ddp:
        # The row added to the input, broadcast over the batch (an AddBackward0), before the
        # blocks.
        row_node, row_out = add_output(1 * MiB * batch)
    elif row_module:
        # The row gathered, the input added to it (an op of its own), before the blocks.
        row_group.pre_forward()
        row_node, row_out = op_output(1 * MiB * batch)
        if reshard:
            row_group.reshard()
    out = model(x, per_block, not ckpt)
    loss = _standin.empty(64 * KiB * batch)
    if zero3:
        zopt.forward_end()
    if fsdp2:
        _fsdp_param_group.forward_end()
    for i in reversed(range(BLOCKS)):
        if fsdp2:
            if reshard:
                groups[i].pre_backward(groups[i - 1] if i > 0 else row_group)
            made = len(kept_grads)
            backward_ops(per_block[i], 256 * KiB * batch, i == 0)
            weight_grads = kept_grads[made:]
            del kept_grads[made:]
            shard = groups[i].post_backward(weight_grads, 1 * MiB * len(weight_grads))
            if shard is not None:
                shards.append(shard)
            continue
        if ckpt and reentrant:
            kept_output = per_block[i][0]
            again = []
            model.blocks[i](x, again, True)
            # The copy of the block's output goes at once; the run's own goes in the backward.
            node, copy = again.pop()
            _standin.free(copy)
            again.append(kept_output)
            backward_ops(again, 256 * KiB * batch)
        elif ckpt:
            # Made again up to the last saved tensor (the second op's output), the third op's
            # node using the block's output the run kept.
            again = []
            model.blocks[i](x, again, True, 2)
            copies = {out for _, out in again}
            node = per_block[i][0][0]
            backward_ops(again + [(node, per_block[i][0][1])], 256 * KiB * batch, copies=copies)
        else:
            backward_ops(per_block[i], 256 * KiB * batch, i == 0)
    if row_module and ddp:
        # The broadcast's backward sums the row's gradient over the batch: kept to the step.
        g = autograd.standin_backward_node(row_node, ROW)
        assert g, "out of memory"
        kept_grads.append(g)
        _standin.free(row_out)
    elif row_module:
        if reshard:
            row_group.pre_backward()
        g = autograd.standin_backward_node(row_node, ROW)
        assert g, "out of memory"
        shards.append(row_group.post_backward([g], world * ROW))
        _standin.free(row_out)
    if fsdp2:
        _fsdp_param_group.step_end()
    if zero:
        run_hooks()
        zopt.backward_end()
    opt.step()
    for g in kept_grads + shards:
        _standin.free(g)
    kept_grads.clear()
    shards.clear()
    _standin.free(loss)
    if cast_x is not None:
        _standin.free(cast_x)
    _standin.free(x)
print("trained", steps)
