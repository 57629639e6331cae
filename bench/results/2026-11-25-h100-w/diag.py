"""diag.py FILE: torch's count of allocated device memory along a load_file, its tensors deleted, a safe_open
get_tensor, and the blocks still allocated at the end with the Python frames that made them."""
import gc, sys
import torch
torch.zeros(1, device="cuda:0")
import weightlift
f = sys.argv[1]
def ma(tag):
    torch.cuda.synchronize(); print(f"{tag:>22}: allocated {torch.cuda.memory_allocated(0)}", flush=True)
ma("start")
torch.cuda.memory._record_memory_history(max_entries=100000)
got = weightlift.load_file(f, device="cuda:0"); ma("loaded")
print("tensor bytes", sum(t.numel() * t.element_size() for t in got.values()), "report", weightlift.last_report()["device_memory"])
del got; ma("del got")
with weightlift.safe_open(f, device="cuda:0") as h:
    one = h.get_tensor(h.keys()[0])
ma("safe_open get_tensor")
del one; ma("del one")
gc.collect(); ma("gc.collect")
weightlift.last_report(); ma("after a weightlift call")
got = weightlift.load_file(f, device="cuda:0"); ma("loaded again")
del got; ma("del again")
snap = torch.cuda.memory._snapshot()
for seg in snap["segments"]:
    for b in seg["blocks"]:
        if b["state"] == "active_allocated":
            fr = [(x["filename"].split("/")[-1], x["line"], x["name"]) for x in b.get("frames", []) if x["filename"].endswith(".py")]
            print("live", b["size"], fr[:8])
