#!/usr/bin/python3
"""life.py: Conway's Game of Life on a torus, distributed with MPI (mpi4py).

    mpirun.openmpi -np 4 python3 life.py --width 2048 --height 2048 --generations 3000
    cairn run --job life --ranks 4 --mpi openmpi -- /usr/bin/python3 life.py ...

The board (--width x --height cells, both wrapping around) is cut into
horizontal strips of equal height, one per MPI rank. A rank holds its strip
as one Python integer, cell (x, y) of the strip at bit y*width + x, and
computes a generation for all its cells at once with bitwise operations: the
8 neighbour planes are shifted copies of the strip, added by a bit-sliced
adder. Per generation:

  1. halo exchange (MPI_Sendrecv, point to point): a rank sends its top row
     to the rank above and its bottom row to the rank below, and receives
     the rows that border its strip from them (the torus also wraps from
     the last rank to the first);
  2. the next generation of the strip, from the strip and the two halo rows;
  3. every --every generations, MPI_Allreduce(SUM) of the live and the
     changed cells (64-bit integers); rank 0 prints them.

Rank 0 reads the arguments and broadcasts them (MPI_Bcast); at the end the
strips are gathered in rank order on rank 0 (MPI_Gather), which prints the
population and the SHA-256 of the whole board.

The output is deterministic and independent of the number of ranks: the
initial board is SHA-256 of the seed and the row number in counter mode (no
random generator whose sequence could change between Python versions), all
arithmetic is on integers, the sums are of integers (exact in any order),
and the final digest is of the gathered board, row by row. Only the t=
figures (elapsed seconds) vary.
"""

import argparse
import hashlib
import sys
import time
from array import array

from mpi4py import MPI


def initial_row(seed, y, width):
    """Row y of the initial board: width bits, about half of them set."""
    out = bytearray()
    k = 0
    while len(out) < width // 8:
        out += hashlib.sha256(b"life %d %d %d" % (seed, y, k)).digest()
        k += 1
    return int.from_bytes(out[: width // 8], "little")


class Strip:
    """rows x width cells of the board, as one integer, and the masks a
    generation needs for rows + 2 rows (the strip between its halos)."""

    def __init__(self, cells, rows, width):
        self.cells, self.rows, self.width = cells, rows, width
        ext = (rows + 2) * width
        self.row_mask = (1 << width) - 1
        self.strip_mask = (1 << (rows * width)) - 1
        col0 = 0
        for y in range(rows + 2):
            col0 |= 1 << (y * width)
        self.col_first = col0
        self.col_last = col0 << (width - 1)
        self.full = (1 << ext) - 1

    def top(self):
        return self.cells & self.row_mask

    def bottom(self):
        return self.cells >> ((self.rows - 1) * self.width)

    def step(self, above, below):
        """Advance one generation, given the row above the strip and the
        row below it; returns how many cells changed."""
        w = self.width
        e = above | (self.cells << w) | (below << ((self.rows + 1) * w))
        # Horizontal neighbours, wrapping within each row: l holds, at
        # (x, y), the cell (x-1, y); r the cell (x+1, y).
        l = ((e << 1) & (self.full ^ self.col_first)) | ((e >> (w - 1)) & self.col_first)
        r = ((e >> 1) & (self.full ^ self.col_last)) | ((e << (w - 1)) & self.col_last)
        # The 8 neighbours: left and right in the row, and the three cells
        # of the rows above (shifted down by a row) and below.
        n = (l, r, l << w, e << w, r << w, l >> w, e >> w, r >> w)
        # Bit-sliced sum of the 8 planes, modulo 8 (8 neighbours count as
        # 0: dead either way).
        s1, c1 = full_add(n[0], n[1], n[2])
        s2, c2 = full_add(n[3], n[4], n[5])
        s3, c3 = n[6] ^ n[7], n[6] & n[7]
        b0, c4 = full_add(s1, s2, s3)
        t1, d1 = full_add(c1, c2, c3)
        b1, d2 = t1 ^ c4, t1 & c4
        b2 = d1 ^ d2
        # Alive next: 3 neighbours, or 2 and alive now.
        nxt = b1 & ~b2 & (b0 | e)
        nxt = (nxt >> w) & self.strip_mask
        changed = (nxt ^ self.cells).bit_count()
        self.cells = nxt
        return changed


def full_add(x, y, z):
    s = x ^ y
    return s ^ z, (x & y) | (s & z)


def main():
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()

    # Rank 0 reads the configuration; everyone gets it by broadcast.
    cfg = array("q", [0] * 5)
    if rank == 0:
        p = argparse.ArgumentParser(description="Game of Life on a torus, with MPI")
        p.add_argument("--width", type=int, default=1024, help="cells per row, a multiple of 8")
        p.add_argument("--height", type=int, default=1024, help="rows, a multiple of the number of ranks")
        p.add_argument("--generations", type=int, default=1000)
        p.add_argument("--every", type=int, default=100, help="print the population every N generations (0: never)")
        p.add_argument("--seed", type=int, default=1)
        a = p.parse_args()
        ok = a.width >= 8 and a.width % 8 == 0 and a.height > 0 and a.height % size == 0
        if not ok:
            print(f"life: --width must be a multiple of 8 and --height of {size} (the ranks)", file=sys.stderr, flush=True)
        cfg = array("q", [a.width, a.height, a.generations, a.every, a.seed] if ok else [0] * 5)
    comm.Bcast([cfg, MPI.INT64_T], root=0)
    width, height, generations, every, seed = cfg
    if width == 0:
        return 2

    rows = height // size
    first = rank * rows
    cells = 0
    for y in range(rows):
        cells |= initial_row(seed, first + y, width) << (y * width)
    strip = Strip(cells, rows, width)
    up, down = (rank - 1) % size, (rank + 1) % size
    rowbytes = width // 8
    above, below = bytearray(rowbytes), bytearray(rowbytes)

    def totals(changed):
        mine = array("q", [strip.cells.bit_count(), changed])
        out = array("q", [0, 0])
        comm.Allreduce([mine, MPI.INT64_T], [out, MPI.INT64_T], op=MPI.SUM)
        return out[0], out[1]

    pop, _ = totals(0)
    if rank == 0:
        print(f"life {width}x{height} on {size} ranks, {rows} rows each: population {pop} at generation 0", flush=True)
    comm.Barrier()
    t0 = time.monotonic()
    for gen in range(1, generations + 1):
        # My top row goes up and the row below my strip comes from below;
        # my bottom row goes down and the row above comes from above.
        comm.Sendrecv([strip.top().to_bytes(rowbytes, "little"), MPI.BYTE], dest=up, sendtag=1,
                      recvbuf=[below, MPI.BYTE], source=down, recvtag=1)
        comm.Sendrecv([strip.bottom().to_bytes(rowbytes, "little"), MPI.BYTE], dest=down, sendtag=2,
                      recvbuf=[above, MPI.BYTE], source=up, recvtag=2)
        changed = strip.step(int.from_bytes(above, "little"), int.from_bytes(below, "little"))
        if every > 0 and gen % every == 0:
            pop, ch = totals(changed)
            if rank == 0:
                print(f"generation {gen}/{generations} population={pop} changed={ch} t={time.monotonic() - t0:.1f}s", flush=True)

    pop, _ = totals(0)
    board = bytearray(height * rowbytes) if rank == 0 else None
    comm.Gather([strip.cells.to_bytes(rows * rowbytes, "little"), MPI.BYTE], [board, MPI.BYTE] if rank == 0 else None, root=0)
    if rank == 0:
        digest = hashlib.sha256(board).hexdigest()
        print(f"FINAL width={width} height={height} generations={generations} population={pop} sha256={digest} t={time.monotonic() - t0:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
