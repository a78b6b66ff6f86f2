#!/usr/bin/python3
"""appmode.py: a rank of an application-level job, which saves its own
state when told to instead of being dumped by CRIU.

    cairn run --job app --ranks 4 --mode app --checkpoint-every 30s -- /usr/bin/python3 appmode.py --steps 3000

Before each checkpoint (prepare) the rank writes its state, the step it has
reached and its accumulator, to a file in its own directory, atomically: a
temporary file, fsync, rename, fsync of the directory. cairn then captures
the files the container wrote. On a restart the rank's command starts afresh
on those files with $CAIRN_RESTART set (the checkpoint they are from): the
rank reads its state back and goes on from there. The final checksum is the
same whatever happened. Outside cairn it runs alone, as rank 0, and says so.
"""

import argparse
import json
import os
import sys
import threading
import time

sys.path.append("/opt/cairn/python")
import cairn  # noqa: E402

MASK = (1 << 64) - 1


def mix64(x):
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & MASK
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & MASK
    return x ^ (x >> 33)


def save(path, state):
    """Writes state to path atomically: the file is the old one or the new one."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    fd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--every", type=int, default=250)
    p.add_argument("--sleep-ms", type=int, default=10)
    p.add_argument("--dir", default="/var/lib/appmode", help="where the rank keeps its state")
    p.add_argument("--rank", type=int, default=0, help="the rank to be when run outside cairn")
    a = p.parse_args()

    rank = int(os.environ.get("CAIRN_RANK", a.rank))
    os.makedirs(a.dir, exist_ok=True)
    path = os.path.join(a.dir, f"rank-{rank}.json")
    lock = threading.Lock()
    state = {"step": 0, "acc": mix64(rank + 1)}
    restart = os.environ.get("CAIRN_RESTART")
    if restart:
        with open(path) as f:
            state = json.load(f)
        print(f"rank {rank}: restarted from checkpoint {restart}, at step {state['step']}", flush=True)

    def prepare(ckpt, mode):
        with lock:
            snapshot = dict(state)
        save(path, snapshot)
        print(f"rank {rank}: saved step {snapshot['step']} for checkpoint {ckpt}", flush=True)

    try:
        cairn.watch(prepare=prepare)
    except cairn.CairnError as e:
        print(f"rank {rank}: not in a cairn rank ({e}): running alone", flush=True)

    while True:
        with lock:
            if state["step"] >= a.steps:
                break
            state["step"] += 1
            step = state["step"]
            acc = state["acc"]
            for i in range(200):
                acc = mix64(acc ^ (step << 8 | i))
            state["acc"] = acc
        if step % a.every == 0:
            print(f"rank {rank}: steps {step - a.every + 1}-{step} done", flush=True)
        time.sleep(a.sleep_ms / 1000)

    print(f"rank {rank}: FINAL steps={a.steps} checksum={state['acc']:016x}", flush=True)


main()
