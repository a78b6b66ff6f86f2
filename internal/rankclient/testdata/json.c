/* json.c: libcairn's JSON reader and writer on their own, driven by
 * clients_test.go: one line out per case. It includes cairn.c to reach its
 * static functions. */
#include "cairn.c"

/* show prints s with every byte outside printable ASCII as \xHH. */
static void show(const char *name, const char *s) {
	printf(" %s=", name);
	for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
		if (*c < 0x20 || *c >= 0x7f || *c == '\\') printf("\\x%02x", *c);
		else putchar(*c);
	}
}

static void decode_case(const char *in) {
	struct reply r;
	int rc = decode(in, strlen(in), &r);
	if (rc < 0) {
		printf("rc=%d\n", rc);
		return;
	}
	printf("ok=%d restored=%d rank=%d size=%d ckpt=%d from=%d inc=%d deadline=%d",
	       r.ok, r.restored, r.rank, r.size, r.ckpt, r.restored_from, r.incarnation, r.deadline_ms);
	show("job", r.job);
	show("mode", r.mode);
	show("code", r.code);
	show("error", r.error);
	show("state", r.state);
	show("event", r.event);
	printf(" len(job)=%zu\n", strlen(r.job));
}

int main(int argc, char **argv) {
	char line[256];
	(void)argc;
	(void)argv;
	/* Requests: one per line, as written. */
	struct request req = {"event", "j\"ob", NULL, "k\\ind", "a\nb\tc\x01\x7f\xc3\xa9", 1, 1, 250, NULL};
	struct buf b = {line, 0, sizeof line, 0};
	int rc0 = encode(&b, &req);
	printf("encode rc=%d %s", rc0, line);
	char big[200];
	memset(big, 'x', sizeof big - 1);
	big[sizeof big - 1] = '\0';
	struct request long_req = {"event", NULL, NULL, "k", big, 0, 0, 0, NULL};
	struct buf small = {line, 0, 64, 0};
	int rc = encode(&small, &long_req);
	printf("encode overflow rc=%d len=%zu overflow=%d\n", rc, small.len, small.overflow);

	/* Replies: one per line of stdin. */
	static char in[70000];
	while (fgets(in, sizeof in, stdin)) {
		in[strcspn(in, "\n")] = '\0';
		decode_case(in);
	}
	return 0;
}
