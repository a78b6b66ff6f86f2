/*
 * cairn-mpich-finalize: preloaded into the processes of MPICH jobs that
 * cairn launches (cairn run --mpi mpich), as libcairn-mpich-finalize.so.
 *
 * Debian 12's MPICH 4.0.2 over UCX 1.13's TCP transport hangs in
 * MPI_Finalize in most runs, with or without cairn: it disconnects its
 * UCX endpoints without first synchronising the ranks, and a rank that
 * disconnects first leaves a zero-length remote flush its peers never
 * answer (later MPICH releases run a PMI barrier first). This library
 * does the same: before the process's first ucp_disconnect_nb it runs a
 * PMI-1 barrier over the PMI connection hydra gave it ($PMI_FD). It
 * changes nothing else.
 *
 * Built by cairn's setup (scripts/setup.sh):
 *   cc -O2 -shared -fPIC -o libcairn-mpich-finalize.so cairn-mpich-finalize.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef void *ucs_status_ptr_t;
typedef struct ucp_ep *ucp_ep_h;

static int pmi_fd = -1;
static int done;

/* $PMI_FD is read at load: MPI_Init may drop it from the environment. */
__attribute__((constructor)) static void init(void)
{
	const char *s = getenv("PMI_FD");
	if (s != NULL)
		pmi_fd = atoi(s);
}

static int write_all(int fd, const char *p, size_t n)
{
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* One PMI-1 barrier. Replies are read a byte at a time so that nothing
 * meant for MPICH is left buffered here. */
static void pmi_barrier(void)
{
	char line[256];
	if (pmi_fd < 0 || write_all(pmi_fd, "cmd=barrier_in\n", 15) < 0)
		return;
	for (;;) {
		size_t n = 0;
		while (n < sizeof line - 1) {
			ssize_t r = read(pmi_fd, line + n, 1);
			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0)
				return;
			if (line[n++] == '\n')
				break;
		}
		line[n] = 0;
		if (strstr(line, "cmd=barrier_out") != NULL)
			return;
	}
}

ucs_status_ptr_t ucp_disconnect_nb(ucp_ep_h ep)
{
	static ucs_status_ptr_t (*real)(ucp_ep_h);
	if (real == NULL)
		real = (ucs_status_ptr_t (*)(ucp_ep_h))dlsym(RTLD_NEXT, "ucp_disconnect_nb");
	if (!done) {
		done = 1;
		pmi_barrier();
	}
	return real(ep);
}
