"""A short transformer training run (sequence length changes every step). Prints PyTorch's own
allocator counters as one 'STATS {json}' line, then leaves with os._exit so that nothing is freed
after the counters were read: the trace and the counters describe the same moment."""
import json
import os

import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.TransformerEncoder(
    nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, batch_first=True),
    num_layers=4,
).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(10):
    seq = 128 + (step * 37 % 8) * 64
    x = torch.randn(16, seq, 512, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
st = torch.cuda.memory_stats()
keys = ["num_device_alloc", "num_device_free", "allocation.all.allocated", "allocation.all.freed",
        "reserved_bytes.all.current", "allocated_bytes.all.current"]
out = {k: st.get(k) for k in keys}
out["memory_allocated"] = torch.cuda.memory_allocated()
out["memory_reserved"] = torch.cuda.memory_reserved()
out["loss"] = float(loss)
print("STATS " + json.dumps(out), flush=True)
os._exit(0)
