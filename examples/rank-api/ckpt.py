#!/usr/bin/python3
"""ckpt.py: a rank that asks cairn for a checkpoint of its job from inside
(ckpt.c in Python).

    cairn run --job ckpy --ranks 4 -- /usr/bin/python3 ckpt.py --steps 3000 --checkpoint-at 1000

Every rank holds its state in memory and mixes it, step after step, with
integer arithmetic only: its final checksum depends on its rank and the
number of steps, nothing else. At --checkpoint-at, rank --asker (0) asks for
a global checkpoint of the job and waits for it. cairn.checkpoint() returns
twice, like fork: after the checkpoint, and again if the job is restored
from it, later, on whichever node; the restored ranks then redo the steps
after it, and print the same checksums. Outside cairn it runs alone, as
rank 0, and says so.
"""

import argparse
import hashlib
import sys
import time

sys.path.append("/opt/cairn/python")
import cairn  # noqa: E402

WORDS = 512
MASK = (1 << 64) - 1


def mix64(x):
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & MASK
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & MASK
    return x ^ (x >> 33)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--checkpoint-at", type=int, default=1000)
    p.add_argument("--every", type=int, default=250)
    p.add_argument("--sleep-ms", type=int, default=10)
    p.add_argument("--asker", type=int, default=0)
    p.add_argument("--rank", type=int, default=0, help="the rank to be when run outside cairn")
    p.add_argument("--try-job", help="the asker first asks for a checkpoint of this job (refused: a rank acts on its own job only)")
    a = p.parse_args()

    try:
        info = cairn.info()
        rank = info.rank
        print(f"rank {rank} of {info.size}, job {info.job}, incarnation {info.incarnation}", flush=True)
    except cairn.CairnError as e:
        rank = a.rank
        print(f"rank {rank}: not in a cairn rank ({e}): running alone", flush=True)
    if a.try_job and rank == a.asker:
        try:
            cairn.checkpoint(job=a.try_job)
            print(f"rank {rank}: checkpoint of job {a.try_job} accepted", flush=True)
        except cairn.CairnError as e:
            print(f"rank {rank}: checkpoint of job {a.try_job} refused: {e.code}", flush=True)

    state = [mix64(rank << 32 | i) for i in range(WORDS)]
    for step in range(1, a.steps + 1):
        state = [mix64(state[i] ^ state[(i + 1) % WORDS] ^ step) for i in range(WORDS)]
        if step % a.every == 0:
            print(f"rank {rank}: steps {step - a.every + 1}-{step} done", flush=True)
        if step == a.checkpoint_at and rank == a.asker:
            try:
                r = cairn.checkpoint()
                if r.restored:
                    print(f"rank {rank}: restored from checkpoint {r.restored_from}, at step {step}", flush=True)
                else:
                    print(f"rank {rank}: checkpoint {r.ckpt} done at step {step}", flush=True)
            except cairn.CairnError as e:
                print(f"rank {rank}: no checkpoint at step {step}: {e}", flush=True)
        time.sleep(a.sleep_ms / 1000)

    digest = hashlib.sha256(b"".join(x.to_bytes(8, "little") for x in state)).hexdigest()[:16]
    print(f"rank {rank}: FINAL steps={a.steps} checksum={digest}", flush=True)


main()
