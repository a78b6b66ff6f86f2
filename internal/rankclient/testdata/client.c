/* client.c: libcairn against ranktest's fake endpoint, driven by
 * clients_test.go: each step prints one line, the same lines client.py
 * prints. With "noendpoint", only a call without an endpoint. */
#include <cairn.h>

#include <stdio.h>
#include <string.h>
#include <pthread.h>

static const char *code(int rc) {
	switch (rc) {
	case CAIRN_EBADREQUEST: return "bad_request";
	case CAIRN_EFORBIDDEN: return "forbidden";
	case CAIRN_ENOTFOUND: return "not_found";
	case CAIRN_ERATELIMITED: return "rate_limited";
	case CAIRN_EUNAVAILABLE: return "unavailable";
	case CAIRN_EABORTED: return "aborted";
	case CAIRN_ECONFLICT: return "conflict";
	case CAIRN_ENOENDPOINT: return "no_endpoint";
	}
	return cairn_strerror(rc);
}

static void info(void) {
	struct cairn_info i;
	int rc = cairn_info(&i);
	if (rc < 0) {
		printf("info error %s\n", code(rc));
		return;
	}
	printf("info job=%s rank=%d size=%d mode=%s ckpt=%d restored=%d restored_from=%d incarnation=%d\n",
	       i.job, i.rank, i.size, i.mode, i.ckpt, i.restored, i.restored_from, i.incarnation);
}

static void result(const char *what, int rc, const struct cairn_result *r) {
	if (rc < 0) printf("%s error %s\n", what, code(rc));
	else if (r->state == CAIRN_DONE) printf("%s done %d\n", what, r->ckpt);
	else if (r->state == CAIRN_RESTORED) printf("%s restored %d\n", what, r->restored_from);
	else printf("%s state %d\n", what, r->state);
}

static void event(const char *kind, const char *message) {
	int rc = cairn_event(kind, message);
	if (rc < 0) printf("event error %s\n", code(rc));
	else printf("event ok\n");
}

static pthread_mutex_t out = PTHREAD_MUTEX_INITIALIZER;

static int prepare(int ckpt, const char *mode, void *arg) {
	pthread_mutex_lock(&out);
	printf("%s %d %s\n", (const char *)arg, ckpt, mode);
	pthread_mutex_unlock(&out);
	return 0;
}

static void resumed(int ckpt, void *arg) {
	(void)arg;
	pthread_mutex_lock(&out);
	printf("resumed %d\n", ckpt);
	pthread_mutex_unlock(&out);
}

static void restored(int from, void *arg) {
	(void)arg;
	pthread_mutex_lock(&out);
	printf("restored %d\n", from);
	pthread_mutex_unlock(&out);
}

int main(int argc, char **argv) {
	struct cairn_result r;
	char line[256];
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc > 1 && strcmp(argv[1], "noendpoint") == 0) {
		info();
		return 0;
	}
	info();
	for (int i = 0; i < 4; i++) result("checkpoint", cairn_checkpoint(&r), &r);
	result("checkpoint_as", cairn_checkpoint_as("other", &r), &r);
	result("stop", cairn_stop(&r), &r);
	info();
	event("phase.x-1_y", "quote \" backslash \\ newline \n tab \t unicode \xc3\xa9 \xe2\x9c\x93 ctrl \x01 end");
	event("a b", "agent refuses");
	event("kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk", "library refuses");
	int ok = 0, limited = 0;
	for (int i = 0; i < 25; i++) {
		int rc = cairn_event("burst", "n");
		if (rc == 0) ok++;
		else if (rc == CAIRN_ERATELIMITED) limited++;
	}
	printf("events ok=%d limited=%d\n", ok, limited);

	struct cairn_callbacks cb = {prepare, resumed, restored, "prepare"};
	int rc = cairn_watch(&cb, 2000);
	if (rc < 0) {
		printf("watch error %s: %s\n", code(rc), cairn_last_error());
		return 1;
	}
	pthread_mutex_lock(&out);
	printf("watching %d\n", cairn_watch(&cb, 2000) == CAIRN_EBUSY);
	pthread_mutex_unlock(&out);
	while (fgets(line, sizeof line, stdin)) {}
	rc = cairn_unwatch();
	printf("unwatched %d\n", rc);
	return 0;
}
