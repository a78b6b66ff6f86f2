/* mpiring: a deterministic MPI program for checkpoint/restart tests and demos.
 *
 * Every rank holds --mib MiB of uint64 state. Each iteration:
 *   1. mixes its state (xorshift-style, depends on rank and iteration),
 *   2. ring exchange: sends a --ring-kib KiB slice to rank+1, receives from
 *      rank-1 (MPI_Sendrecv) and folds it into its state,
 *   3. MPI_Allreduce(SUM) of a 64-entry digest of its state; the result is
 *      folded back into the state (so every rank depends on every other),
 *   4. optional --sleep-ms to stretch the run without burning CPU.
 * Only integer arithmetic: the final checksum is bit-identical for the same
 * (size, iters, mib, ring-kib), whatever interruptions happened.
 * Rank 0 prints "progress ITER/ITERS sum=..." every --every iterations and
 * "FINAL size=N iters=I checksum=HEX" at the end.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static uint64_t mix64(uint64_t x) {
	x ^= x >> 33; x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL;
	x ^= x >> 33; return x;
}

static double now(void) {
	struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
	long iters = 600, every = 20, mib = 4, ring_kib = 256, sleep_ms = 50;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atol(argv[++i]);
		else if (!strcmp(argv[i], "--every") && i + 1 < argc) every = atol(argv[++i]);
		else if (!strcmp(argv[i], "--mib") && i + 1 < argc) mib = atol(argv[++i]);
		else if (!strcmp(argv[i], "--ring-kib") && i + 1 < argc) ring_kib = atol(argv[++i]);
		else if (!strcmp(argv[i], "--sleep-ms") && i + 1 < argc) sleep_ms = atol(argv[++i]);
		else { fprintf(stderr, "usage: mpiring [--iters N] [--every N] [--mib N] [--ring-kib N] [--sleep-ms N]\n"); return 2; }
	}
	struct timespec w0, w1;
	clock_gettime(CLOCK_REALTIME, &w0);
	double t0 = now();
	MPI_Init(&argc, &argv);
	clock_gettime(CLOCK_REALTIME, &w1);
	double tinit = now() - t0;
	int rank, size;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	char host[256] = "";
	gethostname(host, sizeof host);
	printf("rank %d/%d on %s pid %d MPI_Init %.3fs (wall %ld.%03ld -> %ld.%03ld)\n", rank, size, host, (int)getpid(), tinit,
	       (long)w0.tv_sec, w0.tv_nsec / 1000000, (long)w1.tv_sec, w1.tv_nsec / 1000000);
	fflush(stdout);

	size_t n = (size_t)mib * 1024 * 1024 / 8;
	size_t rn = (size_t)ring_kib * 1024 / 8;
	if (rn > n) rn = n;
	uint64_t *st = malloc(n * 8), *rbuf = malloc(rn * 8);
	uint64_t dig[64], red[64];
	if (!st || !rbuf) { fprintf(stderr, "out of memory\n"); MPI_Abort(MPI_COMM_WORLD, 1); }
	for (size_t i = 0; i < n; i++) st[i] = mix64(((uint64_t)rank << 40) ^ i);

	int right = (rank + 1) % size, left = (rank + size - 1) % size;
	double tloop = now();
	for (long it = 0; it < iters; it++) {
		/* 1. mix */
		uint64_t k = mix64((uint64_t)it * 0x9e3779b97f4a7c15ULL + rank);
		for (size_t i = 0; i < n; i++) { st[i] = mix64(st[i] ^ k); k += st[i]; }
		/* 2. ring: slice at a moving offset */
		size_t off = (size_t)(it * 7919) % (n - rn + 1);
		MPI_Sendrecv(st + off, (int)rn, MPI_UINT64_T, right, (int)(it & 0x7fff),
		             rbuf, (int)rn, MPI_UINT64_T, left, (int)(it & 0x7fff),
		             MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		for (size_t i = 0; i < rn; i++) st[(off + i * 3) % n] ^= rbuf[i];
		/* 3. allreduce of a digest */
		memset(dig, 0, sizeof dig);
		for (size_t i = 0; i < n; i++) dig[i & 63] += st[i];
		MPI_Allreduce(dig, red, 64, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
		for (size_t i = 0; i < n; i++) st[i] += red[(i * 13) & 63];
		if (rank == 0 && every > 0 && (it + 1) % every == 0) {
			printf("progress %ld/%ld sum=%016llx t=%.1fs\n", it + 1, iters,
			       (unsigned long long)red[0], now() - tloop);
			fflush(stdout);
		}
		if (sleep_ms > 0) usleep(sleep_ms * 1000);
	}
	/* final checksum: hash of every rank's state, combined in rank order */
	uint64_t h = 0x12345678ULL;
	for (size_t i = 0; i < n; i++) h = mix64(h ^ st[i]);
	uint64_t *all = rank == 0 ? malloc(sizeof(uint64_t) * size) : NULL;
	MPI_Gather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
	if (rank == 0) {
		uint64_t c = 0;
		for (int r = 0; r < size; r++) c = mix64(c ^ all[r]) + r;
		printf("FINAL size=%d iters=%ld mib=%ld ring_kib=%ld checksum=%016llx loop=%.1fs\n",
		       size, iters, mib, ring_kib, (unsigned long long)c, now() - tloop);
		fflush(stdout);
	}
	MPI_Finalize();
	return 0;
}
