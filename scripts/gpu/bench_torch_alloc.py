"""Time PyTorch's caching allocator on the size mix of `vramfit-agent bench alloc`.

Usage: python3 bench_torch_alloc.py [--ops 20000] [--seed 42] [--rounds 3] > torch_alloc.json

The mix generator mirrors agent/src/bench.rs exactly (same constants, same
draw order), so both programs time the same sequence of requests.
torch.cuda.caching_allocator_alloc/delete is used rather than torch.empty to
keep tensor construction out of the numbers; Python call overhead remains
and is part of what a PyTorch program pays.
"""

import argparse
import json
import time

MASK = (1 << 64) - 1
LIVE_WINDOW = 64


class MixRng:
    def __init__(self, seed):
        self.state = seed & MASK

    def next(self):
        self.state = (self.state * 6364136223846793005 + 1442695040888963407) & MASK
        return self.state >> 33

    def size(self):
        r = self.next() % 100
        if r < 60:
            return 512 << (self.next() % 12)
        if r < 90:
            return (1 << 20) + self.next() % (9 << 20)
        return (10 << 20) + self.next() % (246 << 20)


def size_mix(ops, seed):
    rng = MixRng(seed)
    live, events, next_id = [], [], 0
    for _ in range(ops):
        if len(live) < LIVE_WINDOW // 2 or (len(live) < LIVE_WINDOW and rng.next() % 2 == 0):
            events.append(("alloc", next_id, rng.size()))
            live.append(next_id)
            next_id += 1
        else:
            index = rng.next() % len(live)
            live[index], live[-1] = live[-1], live[index]
            events.append(("free", live.pop(), 0))
    return events


def percentile(sorted_values, share):
    if not sorted_values:
        return 0.0
    return sorted_values[round((len(sorted_values) - 1) * share)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import torch

    mix = size_mix(args.ops, args.seed)
    torch.cuda.init()
    stream = torch.cuda.current_stream()
    alloc = torch.cuda.caching_allocator_alloc
    delete = torch.cuda.caching_allocator_delete
    alloc_us, free_us, timed = [], [], 0.0
    clock = time.perf_counter_ns
    for round_index in range(max(args.rounds, 2)):
        ptrs = {}
        for op, block, size in mix:
            if op == "alloc":
                start = clock()
                ptr = alloc(size, 0, stream)
                took = clock() - start
                ptrs[block] = ptr
                if round_index > 0:
                    alloc_us.append(took / 1e3)
                    timed += took
            else:
                ptr = ptrs.pop(block)
                start = clock()
                delete(ptr)
                took = clock() - start
                if round_index > 0:
                    free_us.append(took / 1e3)
                    timed += took
        for ptr in ptrs.values():
            delete(ptr)
    alloc_us.sort()
    free_us.sort()
    row = {
        "name": "PyTorch caching allocator (caching_allocator_alloc/delete)",
        "allocs": len(alloc_us),
        "frees": len(free_us),
        "allocP50Us": percentile(alloc_us, 0.5),
        "allocP99Us": percentile(alloc_us, 0.99),
        "freeP50Us": percentile(free_us, 0.5),
        "freeP99Us": percentile(free_us, 0.99),
        "opsPerSecond": (len(alloc_us) + len(free_us)) / (timed / 1e9) if timed else 0.0,
        "peakReservedBytes": torch.cuda.max_memory_reserved(),
    }
    print(json.dumps({"ops": args.ops, "seed": args.seed, "torch": torch.__version__, "rows": [row]}, indent=2))


if __name__ == "__main__":
    main()
