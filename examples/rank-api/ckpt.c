/* ckpt.c: a rank that asks cairn for a checkpoint of its job from inside.
 *
 *   cc -O2 -I/opt/cairn/include -o ckpt ckpt.c -L/opt/cairn/lib -lcairn -pthread -Wl,-rpath,/opt/cairn/lib
 *   cairn run --job ck --ranks 4 -- ./ckpt --steps 3000 --checkpoint-at 1000
 *
 * Every rank holds 32 KiB of state in memory and mixes it, step after step,
 * with integer arithmetic only: its final checksum depends on its rank and
 * the number of steps, nothing else. At --checkpoint-at, rank --asker (0)
 * asks for a global checkpoint of the job (every rank) and waits for it.
 * cairn_checkpoint returns twice, like fork: after the checkpoint ("checkpoint
 * N done"), and again if the job is restored from it, later, on whichever
 * node ("restored from checkpoint N"); the restored ranks then redo the steps
 * after it, and print the same checksums. Outside cairn it runs alone, as
 * rank 0, and says so.
 */
#include <cairn.h>

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WORDS 4096 /* 32 KiB of state */

static uint64_t mix64(uint64_t x) {
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ULL;
	x ^= x >> 33;
	return x;
}

int main(int argc, char **argv) {
	long steps = 3000, at = 1000, every = 250, sleep_ms = 10, asker = 0, alone = 0;
	const char *try_job = NULL;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atol(argv[++i]);
		else if (!strcmp(argv[i], "--checkpoint-at") && i + 1 < argc) at = atol(argv[++i]);
		else if (!strcmp(argv[i], "--every") && i + 1 < argc) every = atol(argv[++i]);
		else if (!strcmp(argv[i], "--sleep-ms") && i + 1 < argc) sleep_ms = atol(argv[++i]);
		else if (!strcmp(argv[i], "--asker") && i + 1 < argc) asker = atol(argv[++i]);
		else if (!strcmp(argv[i], "--rank") && i + 1 < argc) alone = atol(argv[++i]);
		else if (!strcmp(argv[i], "--try-job") && i + 1 < argc) try_job = argv[++i];
		else {
			fprintf(stderr, "usage: ckpt [--steps N] [--checkpoint-at STEP] [--every N] [--sleep-ms MS] [--asker RANK]\n"
			                "            [--rank R (outside cairn)] [--try-job JOB (the asker asks for JOB's checkpoint first)]\n");
			return 2;
		}
	}
	setvbuf(stdout, NULL, _IOLBF, 0);

	struct cairn_info info;
	int rank = 0, rc = cairn_info(&info);
	if (rc == 0) {
		rank = info.rank;
		printf("rank %d of %d, job %s, incarnation %d\n", rank, info.size, info.job, info.incarnation);
	} else {
		rank = (int)alone;
		printf("rank %d: not in a cairn rank (%s): running alone\n", rank, cairn_strerror(rc));
	}
	if (try_job != NULL && rank == asker) {
		/* A rank may act on its own job only: this is refused. */
		struct cairn_result res;
		rc = cairn_checkpoint_as(try_job, &res);
		if (rc == 0)
			printf("rank %d: checkpoint of job %s accepted\n", rank, try_job);
		else
			printf("rank %d: checkpoint of job %s refused: %s\n", rank, try_job, cairn_strerror(rc));
	}

	static uint64_t state[WORDS];
	for (int i = 0; i < WORDS; i++) state[i] = mix64((uint64_t)rank << 32 | (uint64_t)i);
	struct timespec pause = {sleep_ms / 1000, sleep_ms % 1000 * 1000000L};

	for (long step = 1; step <= steps; step++) {
		for (int i = 0; i < WORDS; i++) state[i] = mix64(state[i] ^ state[(i + 1) % WORDS] ^ (uint64_t)step);
		if (step % every == 0) printf("rank %d: steps %ld-%ld done\n", rank, step - every + 1, step);
		if (step == at && rank == asker) {
			struct cairn_result res;
			rc = cairn_checkpoint(&res);
			if (rc == 0 && res.state == CAIRN_RESTORED)
				printf("rank %d: restored from checkpoint %d, at step %ld\n", rank, res.restored_from, step);
			else if (rc == 0)
				printf("rank %d: checkpoint %d done at step %ld\n", rank, res.ckpt, step);
			else
				printf("rank %d: no checkpoint at step %ld: %s\n", rank, step, cairn_last_error());
		}
		nanosleep(&pause, NULL);
	}

	uint64_t sum = 0;
	for (int i = 0; i < WORDS; i++) sum = mix64(sum ^ state[i]);
	printf("rank %d: FINAL steps=%ld checksum=%016" PRIx64 "\n", rank, steps, sum);
	return 0;
}
