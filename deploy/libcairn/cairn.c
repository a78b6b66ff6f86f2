/*
 * cairn.c: libcairn, the C client of cairn's rank API (see cairn.h and
 * docs/rank-api.md).
 *
 * A message is one JSON object on one line of at most 64 KiB. Requests are
 * written by a small writer that escapes strings; replies are read by a
 * small parser that knows the few fields of the protocol, skips any other,
 * and never writes past a buffer (long strings are cut).
 */
#define _POSIX_C_SOURCE 200809L

#include "cairn.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAX_LINE (64 * 1024) /* a message, newline included */
#define MAX_KIND 32
#define MAX_MESSAGE 1024
#define RETRY_MS 50
#define DEFAULT_SOCKET "/run/cairn/rank.sock"

/* "Away": the endpoint is not there for now; the caller tries again. */
#define AWAY 1

/* --- the calling thread's last error ------------------------------------ */

#define ERR_MAX 512

static pthread_key_t err_key;
static pthread_once_t err_once = PTHREAD_ONCE_INIT;

static void err_init(void) { pthread_key_create(&err_key, free); }

static char *err_buf(void) {
	pthread_once(&err_once, err_init);
	char *b = pthread_getspecific(err_key);
	if (!b) {
		b = calloc(1, ERR_MAX);
		if (b && pthread_setspecific(err_key, b) != 0) {
			free(b);
			b = NULL;
		}
	}
	return b;
}

static void clear_error(void) {
	char *b = err_buf();
	if (b) b[0] = '\0';
}

/* fail records what went wrong for cairn_last_error and returns code. */
static int fail(int code, const char *fmt, ...) {
	char *b = err_buf();
	if (b) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(b, ERR_MAX, fmt, ap);
		va_end(ap);
	}
	return code;
}

const char *cairn_last_error(void) {
	const char *b = err_buf();
	return b ? b : "";
}

const char *cairn_strerror(int code) {
	switch (code) {
	case CAIRN_OK: return "ok";
	case CAIRN_EBADREQUEST: return "bad request";
	case CAIRN_EFORBIDDEN: return "forbidden: another job or rank than the caller's";
	case CAIRN_ENOTFOUND: return "unknown ticket";
	case CAIRN_ERATELIMITED: return "too many events: try later";
	case CAIRN_EUNAVAILABLE: return "the agent cannot reach the coordinator now";
	case CAIRN_EABORTED: return "the checkpoint was aborted";
	case CAIRN_ECONFLICT: return "the job cannot be checkpointed now";
	case CAIRN_ENOENDPOINT: return "no rank endpoint: not in a rank of cairn's";
	case CAIRN_EPROTO: return "a reply not in the rank API's protocol";
	case CAIRN_ESYS: return "a system call failed";
	case CAIRN_EINVAL: return "invalid argument";
	case CAIRN_EBUSY: return "busy";
	}
	return "unknown error";
}

/* wire_code maps an error code of the wire to a return code. */
static int wire_code(const char *code) {
	static const struct { const char *wire; int code; } codes[] = {
		{"bad_request", CAIRN_EBADREQUEST}, {"forbidden", CAIRN_EFORBIDDEN},
		{"not_found", CAIRN_ENOTFOUND}, {"rate_limited", CAIRN_ERATELIMITED},
		{"unavailable", CAIRN_EUNAVAILABLE}, {"aborted", CAIRN_EABORTED},
		{"conflict", CAIRN_ECONFLICT},
	};
	for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
		if (strcmp(code, codes[i].wire) == 0) return codes[i].code;
	return CAIRN_EPROTO;
}

/* --- writing requests ---------------------------------------------------- */

struct buf {
	char *p;
	size_t len, cap; /* cap counts the NUL */
	int overflow;
};

static void put(struct buf *b, const char *s, size_t n) {
	if (b->overflow || n >= b->cap - b->len) {
		b->overflow = 1;
		return;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

static void puts_raw(struct buf *b, const char *s) { put(b, s, strlen(s)); }

/* put_str writes s as a JSON string. Bytes from 0x80 are copied as they
 * are (UTF-8); control characters are escaped. */
static void put_str(struct buf *b, const char *s) {
	put(b, "\"", 1);
	for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
		char esc[8];
		switch (*c) {
		case '"': put(b, "\\\"", 2); break;
		case '\\': put(b, "\\\\", 2); break;
		case '\n': put(b, "\\n", 2); break;
		case '\r': put(b, "\\r", 2); break;
		case '\t': put(b, "\\t", 2); break;
		case '\b': put(b, "\\b", 2); break;
		case '\f': put(b, "\\f", 2); break;
		default:
			if (*c < 0x20 || *c == 0x7f) {
				snprintf(esc, sizeof esc, "\\u%04x", *c);
				put(b, esc, 6);
			} else {
				put(b, (const char *)c, 1);
			}
		}
	}
	put(b, "\"", 1);
}

static void put_field(struct buf *b, const char *key, const char *value) {
	put(b, ",\"", 2);
	puts_raw(b, key);
	put(b, "\":", 2);
	put_str(b, value);
}

static void put_int(struct buf *b, const char *key, long v) {
	char num[32];
	put(b, ",\"", 2);
	puts_raw(b, key);
	put(b, "\":", 2);
	snprintf(num, sizeof num, "%ld", v);
	puts_raw(b, num);
}

/* The fields of a request; NULL or 0 ones are left out. */
struct request {
	const char *op, *job, *ticket, *kind, *message;
	int stop, prepare, deadline_ms;
	const char *id;
};

/* new_id names a request that changes something into id: sent again
 * after its connection closed, it is carried out once (docs/rank-api.md).
 * 24 hex digits from getrandom, or, where it fails, from the clock, the
 * process and a counter (unique enough for one rank's requests). */
static void new_id(char id[25]) {
	static unsigned long counter;
	unsigned char b[12];
	if (getrandom(b, sizeof b, GRND_NONBLOCK) != (ssize_t)sizeof b) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		unsigned long long x[3] = {(unsigned long long)ts.tv_sec, (unsigned long long)ts.tv_nsec,
		                           ((unsigned long long)getpid() << 32) ^ __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED)};
		for (size_t i = 0; i < sizeof b; i++) b[i] = (unsigned char)(x[i / 4] >> (8 * (i % 4)));
	}
	for (size_t i = 0; i < sizeof b; i++) snprintf(id + 2 * i, 3, "%02x", b[i]);
}

/* encode writes req as one line into b. */
static int encode(struct buf *b, const struct request *req) {
	puts_raw(b, "{\"op\":");
	put_str(b, req->op);
	if (req->id) put_field(b, "id", req->id);
	if (req->job) put_field(b, "job", req->job);
	if (req->stop) puts_raw(b, ",\"stop\":true");
	if (req->ticket) put_field(b, "ticket", req->ticket);
	if (req->kind) put_field(b, "kind", req->kind);
	if (req->message) put_field(b, "message", req->message);
	if (req->prepare) puts_raw(b, ",\"prepare\":true");
	if (req->deadline_ms > 0) put_int(b, "deadline_ms", req->deadline_ms);
	puts_raw(b, "}\n");
	if (b->overflow) return fail(CAIRN_EBADREQUEST, "request longer than 64 KiB");
	return 0;
}

/* --- reading replies ------------------------------------------------------ */

/* A reply or an event: the fields of the protocol. */
struct reply {
	int ok, restored;
	char code[32], error[ERR_MAX - 64], job[CAIRN_JOB_MAX], mode[CAIRN_MODE_MAX];
	char ticket[256], state[16], event[16];
	int rank, size, ckpt, restored_from, incarnation, deadline_ms;
};

struct parser {
	const char *s, *end;
	int depth;
};

static void ws(struct parser *p) {
	while (p->s < p->end && (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r')) p->s++;
}

static int hex4(const char *s, unsigned *out) {
	unsigned v = 0;
	for (int i = 0; i < 4; i++) {
		char c = s[i];
		v <<= 4;
		if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
		else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
		else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
		else return -1;
	}
	*out = v;
	return 0;
}

/* A string being parsed into out (cap bytes, NUL included), cut at the
 * first piece that does not fit. */
struct sink {
	char *out;
	size_t cap, len;
	int cut;
};

static void emit(struct sink *k, const char *s, size_t n) {
	if (!k->out || k->cut) return;
	if (k->len + n >= k->cap) {
		k->cut = 1;
		return;
	}
	memcpy(k->out + k->len, s, n);
	k->len += n;
}

/* string parses a JSON string into out (NUL-terminated, cut to at most
 * cap-1 bytes, never inside a UTF-8 sequence; out NULL: skip it). */
static int string(struct parser *p, char *out, size_t cap) {
	struct sink k = {out, cap, 0, 0};
	if (p->s >= p->end || *p->s != '"') return -1;
	p->s++;
	while (p->s < p->end && *p->s != '"') {
		unsigned char c = (unsigned char)*p->s++;
		if (c < 0x20) return -1;
		if (c != '\\') {
			emit(&k, (const char *)&c, 1);
			continue;
		}
		if (p->s >= p->end) return -1;
		char e = *p->s++, ch;
		switch (e) {
		case '"': case '\\': case '/': ch = e; break;
		case 'b': ch = '\b'; break;
		case 'f': ch = '\f'; break;
		case 'n': ch = '\n'; break;
		case 'r': ch = '\r'; break;
		case 't': ch = '\t'; break;
		case 'u': {
			unsigned u, lo;
			if (p->end - p->s < 4 || hex4(p->s, &u) < 0) return -1;
			p->s += 4;
			if (u >= 0xd800 && u < 0xdc00 && p->end - p->s >= 6 && p->s[0] == '\\' && p->s[1] == 'u' &&
			    hex4(p->s + 2, &lo) == 0 && lo >= 0xdc00 && lo < 0xe000) {
				p->s += 6;
				u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00);
			} else if (u >= 0xd800 && u < 0xe000) {
				u = 0xfffd; /* a lone surrogate */
			}
			char utf[4];
			size_t n;
			if (u < 0x80) {
				utf[0] = (char)u;
				n = 1;
			} else if (u < 0x800) {
				utf[0] = (char)(0xc0 | u >> 6);
				utf[1] = (char)(0x80 | (u & 0x3f));
				n = 2;
			} else if (u < 0x10000) {
				utf[0] = (char)(0xe0 | u >> 12);
				utf[1] = (char)(0x80 | (u >> 6 & 0x3f));
				utf[2] = (char)(0x80 | (u & 0x3f));
				n = 3;
			} else {
				utf[0] = (char)(0xf0 | u >> 18);
				utf[1] = (char)(0x80 | (u >> 12 & 0x3f));
				utf[2] = (char)(0x80 | (u >> 6 & 0x3f));
				utf[3] = (char)(0x80 | (u & 0x3f));
				n = 4;
			}
			emit(&k, utf, n);
			continue;
		}
		default: return -1;
		}
		emit(&k, &ch, 1);
	}
	if (p->s >= p->end) return -1;
	p->s++;
	if (!out || !cap) return 0;
	if (k.cut) {
		/* Drop a UTF-8 sequence cut short at the end. */
		size_t i = k.len;
		while (i > 0 && ((unsigned char)out[i - 1] & 0xc0) == 0x80) i--;
		if (i > 0 && ((unsigned char)out[i - 1] & 0xc0) == 0xc0) {
			unsigned char lead = (unsigned char)out[i - 1];
			size_t want = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : 2;
			if (k.len - (i - 1) < want) k.len = i - 1;
		}
	}
	out[k.len] = '\0';
	return 0;
}

/* number parses a JSON number into *out (out NULL: skip it): its integer
 * part, exponent applied, clamped to int. No strtod: it would follow the
 * program's locale. */
static int number(struct parser *p, int *out) {
	char digits[24]; /* significant digits, leading zeros dropped */
	size_t nd = 0;
	long point = 0; /* where the decimal point is, after digits[point-1] */
	int neg = 0, any = 0;
#define DIGIT (p->s < p->end && *p->s >= '0' && *p->s <= '9')
	if (p->s < p->end && *p->s == '-') { neg = 1; p->s++; }
	for (; DIGIT; p->s++, any = 1) {
		if (nd == 0 && *p->s == '0') continue;
		if (nd < sizeof digits) digits[nd++] = *p->s;
		point++;
	}
	if (!any) return -1;
	if (p->s < p->end && *p->s == '.') {
		p->s++;
		if (!DIGIT) return -1;
		for (; DIGIT; p->s++) {
			if (nd == 0 && *p->s == '0') point--;
			else if (nd < sizeof digits) digits[nd++] = *p->s;
		}
	}
	if (p->s < p->end && (*p->s == 'e' || *p->s == 'E')) {
		long e = 0;
		int eneg = 0;
		p->s++;
		if (p->s < p->end && (*p->s == '+' || *p->s == '-')) eneg = *p->s++ == '-';
		if (!DIGIT) return -1;
		for (; DIGIT; p->s++) if (e < 100000) e = e * 10 + (*p->s - '0');
		point += eneg ? -e : e;
	}
#undef DIGIT
	long long v = 0;
	if (nd > 0 && point > 10) v = INT_MAX;
	else if (nd > 0)
		for (long i = 0; i < point; i++) v = v * 10 + ((size_t)i < nd ? digits[i] - '0' : 0);
	if (v > INT_MAX) v = INT_MAX;
	if (out) *out = (int)(neg ? -v : v);
	return 0;
}

static int literal(struct parser *p, const char *word) {
	size_t n = strlen(word);
	if ((size_t)(p->end - p->s) < n || memcmp(p->s, word, n) != 0) return -1;
	p->s += n;
	return 0;
}

static int object(struct parser *p, struct reply *r);

/* value skips any JSON value (nested at most 16 deep). */
static int value(struct parser *p) {
	ws(p);
	if (p->s >= p->end) return -1;
	switch (*p->s) {
	case '"': return string(p, NULL, 0);
	case 't': return literal(p, "true");
	case 'f': return literal(p, "false");
	case 'n': return literal(p, "null");
	case '{': return object(p, NULL);
	case '[':
		if (++p->depth > 16) return -1;
		p->s++;
		ws(p);
		if (p->s < p->end && *p->s == ']') { p->s++; p->depth--; return 0; }
		for (;;) {
			if (value(p) < 0) return -1;
			ws(p);
			if (p->s < p->end && *p->s == ',') { p->s++; continue; }
			if (p->s < p->end && *p->s == ']') { p->s++; p->depth--; return 0; }
			return -1;
		}
	}
	return number(p, NULL);
}

/* boolean parses true or false (or null, as false) into *out. */
static int boolean(struct parser *p, int *out) {
	if (literal(p, "true") == 0) { *out = 1; return 0; }
	if (literal(p, "false") == 0 || literal(p, "null") == 0) { *out = 0; return 0; }
	return -1;
}

/* text parses a string (or null, as "") into out. */
static int text(struct parser *p, char *out, size_t cap) {
	if (literal(p, "null") == 0) { out[0] = '\0'; return 0; }
	return string(p, out, cap);
}

/* integer parses a number (or null, as 0) into *out. */
static int integer(struct parser *p, int *out) {
	if (literal(p, "null") == 0) { *out = 0; return 0; }
	return number(p, out);
}

/* field parses the value of key into r (r NULL, or a key not of the
 * protocol: skip it). */
static int field(struct parser *p, const char *key, struct reply *r) {
	ws(p);
	if (!r) return value(p);
#define TEXT(k) if (strcmp(key, #k) == 0) return text(p, r->k, sizeof r->k)
#define INT(k) if (strcmp(key, #k) == 0) return integer(p, &r->k)
	TEXT(code); TEXT(error); TEXT(job); TEXT(mode); TEXT(ticket); TEXT(state); TEXT(event);
	INT(rank); INT(size); INT(ckpt); INT(restored_from); INT(incarnation); INT(deadline_ms);
#undef TEXT
#undef INT
	if (strcmp(key, "ok") == 0) return boolean(p, &r->ok);
	if (strcmp(key, "restored") == 0) return boolean(p, &r->restored);
	return value(p);
}

/* object parses a JSON object; its fields go into r (NULL: skip them). */
static int object(struct parser *p, struct reply *r) {
	char key[32];
	ws(p);
	if (p->s >= p->end || *p->s != '{' || ++p->depth > 16) return -1;
	p->s++;
	ws(p);
	if (p->s < p->end && *p->s == '}') { p->s++; p->depth--; return 0; }
	for (;;) {
		ws(p);
		/* A key longer than 31 bytes is cut, and then matches none. */
		if (string(p, key, sizeof key) < 0) return -1;
		ws(p);
		if (p->s >= p->end || *p->s != ':') return -1;
		p->s++;
		if (field(p, key, r) < 0) return -1;
		ws(p);
		if (p->s < p->end && *p->s == ',') { p->s++; continue; }
		if (p->s < p->end && *p->s == '}') { p->s++; p->depth--; return 0; }
		return -1;
	}
}

/* decode parses one line into *r. */
static int decode(const char *line, size_t n, struct reply *r) {
	struct parser p = {line, line + n, 0};
	memset(r, 0, sizeof *r);
	if (object(&p, r) < 0) return fail(CAIRN_EPROTO, "malformed message from the agent: %.80s", line);
	ws(&p);
	if (p.s != p.end) return fail(CAIRN_EPROTO, "trailing bytes after a message: %.80s", line);
	return 0;
}

/* --- connections ------------------------------------------------------------ */

/* A connection and what was read from it but not yet taken. */
struct conn {
	int fd;
	char *buf; /* MAX_LINE + 1 bytes */
	size_t len;
};

static void sleep_ms(int ms) {
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {}
}

static const char *socket_path(void) {
	const char *p = getenv("CAIRN_SOCKET");
	return p && *p ? p : DEFAULT_SOCKET;
}

/* endpoint_gone reports whether path's directory does not exist. */
static int endpoint_gone(const char *path) {
	char dir[sizeof ((struct sockaddr_un *)0)->sun_path];
	struct stat st;
	const char *slash = strrchr(path, '/');
	if (!slash) return 0;
	size_t n = slash == path ? 1 : (size_t)(slash - path);
	memcpy(dir, path, n);
	dir[n] = '\0';
	return stat(dir, &st) < 0 && errno == ENOENT;
}

static void conn_close(struct conn *c) {
	if (c->fd >= 0) close(c->fd);
	c->fd = -1;
	free(c->buf);
	c->buf = NULL;
	c->len = 0;
}

/* conn_dial connects to the endpoint: 0, AWAY, or an error. */
static int conn_dial(struct conn *c) {
	struct sockaddr_un addr;
	const char *path = socket_path();
	memset(&addr, 0, sizeof addr);
	addr.sun_family = AF_UNIX;
	if (strlen(path) >= sizeof addr.sun_path) return fail(CAIRN_EINVAL, "socket path too long: %s", path);
	strcpy(addr.sun_path, path);
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0) return fail(CAIRN_ESYS, "socket: %s", strerror(errno));
	c->len = 0;
	c->buf = malloc(MAX_LINE + 1);
	if (!c->buf) {
		conn_close(c);
		return fail(CAIRN_ESYS, "out of memory");
	}
	int rc;
	while ((rc = connect(c->fd, (struct sockaddr *)&addr, sizeof addr)) < 0 && errno == EINTR) {}
	if (rc == 0) return 0;
	int e = errno;
	conn_close(c);
	if (e == ENOENT || e == ECONNREFUSED || e == EAGAIN) {
		if (endpoint_gone(path)) return fail(CAIRN_ENOENDPOINT, "no rank endpoint at %s: not in a rank of cairn's", path);
		return AWAY;
	}
	return fail(CAIRN_ESYS, "connect %s: %s", path, strerror(e));
}

/* conn_write sends n bytes: 0, AWAY, or an error. */
static int conn_write(struct conn *c, const char *s, size_t n) {
	while (n > 0) {
		ssize_t w = send(c->fd, s, n, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR) continue;
		if (w < 0 && (errno == EPIPE || errno == ECONNRESET)) return AWAY;
		if (w < 0) return fail(CAIRN_ESYS, "send: %s", strerror(errno));
		s += w;
		n -= (size_t)w;
	}
	return 0;
}

/* conn_read reads the next line (without its newline) into *r: 0, AWAY
 * (closed before a whole line), or an error. */
static int conn_read(struct conn *c, struct reply *r) {
	for (;;) {
		char *nl = memchr(c->buf, '\n', c->len);
		if (nl) {
			size_t n = (size_t)(nl - c->buf);
			c->buf[n] = '\0';
			int rc = decode(c->buf, n, r);
			c->len -= n + 1;
			memmove(c->buf, nl + 1, c->len);
			return rc;
		}
		if (c->len >= MAX_LINE) return fail(CAIRN_EPROTO, "message from the agent longer than 64 KiB");
		ssize_t got = recv(c->fd, c->buf + c->len, MAX_LINE - c->len, 0);
		if (got < 0 && errno == EINTR) continue;
		if (got == 0 || (got < 0 && errno == ECONNRESET)) return AWAY;
		if (got < 0) return fail(CAIRN_ESYS, "recv: %s", strerror(errno));
		c->len += (size_t)got;
	}
}

/* exchange sends req and reads its reply on c, trying again every 50 ms
 * while the endpoint is away. c stays open when it succeeds; an error
 * reply becomes its code. stopping, if not NULL, is asked between tries
 * whether to give up (CAIRN_EBUSY). */
static int exchange(struct conn *c, const struct request *req, struct reply *r, int (*stopping)(void)) {
	char line[8 * 1024];
	struct buf b = {line, 0, sizeof line, 0};
	int rc = encode(&b, req);
	if (rc < 0) return rc;
	for (;;) {
		c->fd = -1;
		c->buf = NULL;
		rc = conn_dial(c);
		if (rc == 0) rc = conn_write(c, line, b.len);
		if (rc == 0) rc = conn_read(c, r);
		if (rc != AWAY) break;
		conn_close(c);
		if (stopping && stopping()) return fail(CAIRN_EBUSY, "stopped");
		sleep_ms(RETRY_MS);
	}
	if (rc < 0) {
		conn_close(c);
		return rc;
	}
	if (!r->ok) {
		conn_close(c);
		return fail(wire_code(r->code), "%s", r->error[0] ? r->error : r->code);
	}
	return 0;
}

/* call is one request and its reply. */
static int call(const struct request *req, struct reply *r) {
	struct conn c = {-1, NULL, 0};
	int rc = exchange(&c, req, r, NULL);
	conn_close(&c);
	return rc;
}

/* --- calls ---------------------------------------------------------------------- */

int cairn_info(struct cairn_info *out) {
	struct request req = {"info", NULL, NULL, NULL, NULL, 0, 0, 0, NULL};
	struct reply r;
	clear_error();
	if (!out) return fail(CAIRN_EINVAL, "cairn_info: out is NULL");
	int rc = call(&req, &r);
	if (rc < 0) return rc;
	memset(out, 0, sizeof *out);
	memcpy(out->job, r.job, sizeof out->job);
	memcpy(out->mode, r.mode, sizeof out->mode);
	out->rank = r.rank;
	out->size = r.size;
	out->ckpt = r.ckpt;
	out->restored = r.restored;
	out->restored_from = r.restored_from;
	out->incarnation = r.incarnation;
	return 0;
}

static int checkpoint(const char *job, int stop, struct cairn_result *out) {
	char id[25];
	new_id(id);
	struct request req = {"checkpoint", job, NULL, NULL, NULL, stop, 0, 0, id};
	struct reply *r = malloc(sizeof *r);
	char ticket[sizeof r->ticket];
	int rc;
	clear_error();
	if (!r) return fail(CAIRN_ESYS, "out of memory");
	rc = call(&req, r);
	if (rc < 0) goto out;
	if (!r->ticket[0] || strlen(r->ticket) == sizeof r->ticket - 1) {
		rc = fail(CAIRN_EPROTO, "checkpoint reply without a ticket, or with one too long");
		goto out;
	}
	memcpy(ticket, r->ticket, sizeof ticket);
	struct request res = {"result", job, ticket, NULL, NULL, 0, 0, 0, NULL};
	for (;;) {
		rc = call(&res, r);
		if (rc < 0) goto out;
		if (strcmp(r->state, "pending") != 0) break;
		sleep_ms(RETRY_MS);
	}
	if (strcmp(r->state, "done") == 0) {
		if (out) *out = (struct cairn_result){CAIRN_DONE, r->ckpt, 0};
	} else if (strcmp(r->state, "restored") == 0) {
		if (out) *out = (struct cairn_result){CAIRN_RESTORED, 0, r->restored_from};
	} else {
		rc = fail(CAIRN_EPROTO, "checkpoint %s: unknown state %s", ticket, r->state);
	}
out:
	free(r);
	return rc;
}

int cairn_checkpoint(struct cairn_result *out) { return checkpoint(NULL, 0, out); }

int cairn_stop(struct cairn_result *out) { return checkpoint(NULL, 1, out); }

int cairn_checkpoint_as(const char *job, struct cairn_result *out) {
	if (!job) {
		clear_error();
		return fail(CAIRN_EINVAL, "cairn_checkpoint_as: job is NULL");
	}
	return checkpoint(job, 0, out);
}

int cairn_event(const char *kind, const char *message) {
	char id[25];
	new_id(id);
	struct request req = {"event", NULL, NULL, kind, message ? message : "", 0, 0, 0, id};
	struct reply r;
	clear_error();
	if (!kind) return fail(CAIRN_EINVAL, "cairn_event: kind is NULL");
	size_t n = strlen(kind);
	if (n == 0 || n > MAX_KIND) return fail(CAIRN_EBADREQUEST, "event kind of %zu bytes: 1 to %d", n, MAX_KIND);
	if (strlen(req.message) > MAX_MESSAGE) return fail(CAIRN_EBADREQUEST, "event message of %zu bytes: at most %d", strlen(req.message), MAX_MESSAGE);
	return call(&req, &r);
}

/* --- watch ------------------------------------------------------------------------ */

/* The watch thread; W.mu guards what it shares. */
static struct {
	pthread_mutex_t mu;
	pthread_cond_t cond;
	int running;         /* a thread runs */
	int stop;            /* it is asked to end */
	int fd;              /* its connection, to shut down; -1 */
	int registered, err; /* the first watch's outcome */
	pthread_t thread;
	char errmsg[ERR_MAX]; /* and what went wrong */
	struct cairn_callbacks cb;
	int deadline_ms;
} W = {.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER, .fd = -1};

static int stopping(void) {
	pthread_mutex_lock(&W.mu);
	int stop = W.stop;
	pthread_mutex_unlock(&W.mu);
	return stop;
}

/* started tells cairn_watch how the first watch went. */
static void started(int err) {
	pthread_mutex_lock(&W.mu);
	W.registered = 1;
	W.err = err;
	snprintf(W.errmsg, sizeof W.errmsg, "%s", cairn_last_error());
	pthread_cond_broadcast(&W.cond);
	pthread_mutex_unlock(&W.mu);
}

/* set_fd publishes the connection for cairn_unwatch to shut down; it
 * reports whether the thread is to stop. */
static int set_fd(int fd) {
	pthread_mutex_lock(&W.mu);
	W.fd = fd;
	int stop = W.stop;
	pthread_mutex_unlock(&W.mu);
	return stop;
}

static void *watch_thread(void *unused) {
	struct request req = {"watch", NULL, NULL, NULL, NULL, 0, 1, W.deadline_ms, NULL};
	struct reply *r = malloc(sizeof *r);
	int first = 1, prepared = 0, prev_inc = 0, prev_ckpt = 0;
	(void)unused;
	if (!r) {
		started(fail(CAIRN_ESYS, "out of memory"));
		return NULL;
	}
	while (!stopping()) {
		struct conn c = {-1, NULL, 0};
		int rc = exchange(&c, &req, r, stopping);
		if (rc < 0 && first) {
			started(rc);
			break;
		}
		if (rc < 0) { /* an error reply, say: try again, patiently */
			sleep_ms(RETRY_MS);
			continue;
		}
		if (set_fd(c.fd)) {
			conn_close(&c);
			break;
		}
		/* Where the rank stands now, against the previous reply. */
		char mode[CAIRN_MODE_MAX];
		memcpy(mode, r->mode, sizeof mode);
		if (!first && r->incarnation > prev_inc) {
			if (W.cb.restored) W.cb.restored(r->restored_from, W.cb.arg);
		} else if (!first && (r->ckpt > prev_ckpt || prepared)) {
			if (W.cb.resumed) W.cb.resumed(r->ckpt, W.cb.arg);
		}
		prev_inc = r->incarnation;
		prev_ckpt = r->ckpt;
		prepared = 0;
		if (first) {
			first = 0;
			started(0);
		}
		/* Events, until the agent closes the connection. */
		while (conn_read(&c, r) == 0) {
			if (strcmp(r->event, "prepare") != 0) continue; /* not an event of this version's */
			prepared = 1;
			if (W.cb.prepare && W.cb.prepare(r->ckpt, r->mode[0] ? r->mode : mode, W.cb.arg) != 0) break;
			static const char ready[] = "{\"op\":\"ready\"}\n";
			if (conn_write(&c, ready, sizeof ready - 1) != 0) break;
		}
		set_fd(-1);
		conn_close(&c);
		if (!stopping()) sleep_ms(RETRY_MS);
	}
	free(r);
	return NULL;
}

int cairn_watch(const struct cairn_callbacks *cb, int deadline_ms) {
	sigset_t all, old;
	clear_error();
	if (!cb || deadline_ms < 0) return fail(CAIRN_EINVAL, "cairn_watch: cb is NULL or deadline_ms negative");
	pthread_mutex_lock(&W.mu);
	if (W.running) {
		pthread_mutex_unlock(&W.mu);
		return fail(CAIRN_EBUSY, "cairn_watch: already watching");
	}
	W.running = 1;
	W.stop = 0;
	W.registered = 0;
	W.err = 0;
	W.cb = *cb;
	W.deadline_ms = deadline_ms;
	/* The thread blocks every signal: they are the program's. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int e = pthread_create(&W.thread, NULL, watch_thread, NULL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (e != 0) {
		W.running = 0;
		pthread_mutex_unlock(&W.mu);
		return fail(CAIRN_ESYS, "pthread_create: %s", strerror(e));
	}
	while (!W.registered) pthread_cond_wait(&W.cond, &W.mu);
	int err = W.err;
	pthread_mutex_unlock(&W.mu);
	if (err < 0) {
		pthread_join(W.thread, NULL);
		pthread_mutex_lock(&W.mu);
		W.running = 0;
		pthread_mutex_unlock(&W.mu);
		return fail(err, "%s", W.errmsg);
	}
	return 0;
}

int cairn_unwatch(void) {
	clear_error();
	pthread_mutex_lock(&W.mu);
	if (!W.running) {
		pthread_mutex_unlock(&W.mu);
		return 0;
	}
	if (pthread_equal(pthread_self(), W.thread)) {
		pthread_mutex_unlock(&W.mu);
		return fail(CAIRN_EBUSY, "cairn_unwatch from a callback");
	}
	W.stop = 1;
	if (W.fd >= 0) shutdown(W.fd, SHUT_RDWR);
	pthread_mutex_unlock(&W.mu);
	pthread_join(W.thread, NULL);
	pthread_mutex_lock(&W.mu);
	W.running = 0;
	pthread_mutex_unlock(&W.mu);
	return 0;
}
