/*
 * cairn.h: libcairn, the C client of cairn's rank API (docs/rank-api.md).
 *
 * A program in a rank of a cairn job talks to its node's agent through a
 * unix socket in its container: $CAIRN_SOCKET, else /run/cairn/rank.sock.
 * Through it the rank can ask for a global checkpoint of its job and learn
 * its outcome, stop its job after a checkpoint, read where it stands,
 * publish an event, and be called back before a checkpoint and after it.
 *
 *     cc -I/opt/cairn/include prog.c -L/opt/cairn/lib -lcairn -lpthread \
 *        -Wl,-rpath,/opt/cairn/lib
 *     (or link /opt/cairn/lib/libcairn.a statically)
 *
 * Every function returns 0 or a negative CAIRN_E* code; cairn_strerror()
 * says what a code means, cairn_last_error() what went wrong in the calling
 * thread's last failed call (the agent's message, say).
 *
 * While the endpoint is away (the socket is removed while the rank is
 * frozen for a checkpoint or a migration; a connection closed before its
 * reply) a call tries again every 50 ms, for as long as it takes: a frozen
 * rank's clock does not run, and the endpoint is back once it runs again,
 * on whichever node. A checkpoint or an event sent again carries the id
 * of its first try, so the agent carries it out once. A call fails at
 * once with CAIRN_ENOENDPOINT if the socket's directory does not exist
 * (not in a rank of cairn's).
 *
 * Every function is safe to call from any thread; each call uses a
 * connection of its own. Callbacks of cairn_watch run on a thread of the
 * library's.
 *
 * C++: the declarations are in extern "C"; include <cairn.h> as it is.
 * Write `struct cairn_info` there too, as with stat: the function of the
 * same name hides the type.
 *
 * Fortran: the API has plain C types only (int, char arrays, pointers; no
 * unions, no varargs), so ISO_C_BINDING interfaces can call every
 * function. cairn.f90 (installed as /opt/cairn/include/cairn.f90) is a
 * module of bind(C) interfaces for cairn_info, cairn_checkpoint,
 * cairn_stop, cairn_event and cairn_strerror, with types matching
 * struct cairn_info and struct cairn_result. Strings passed in must end
 * in c_null_char; strings in the structs are NUL-terminated.
 */
#ifndef CAIRN_H
#define CAIRN_H

#ifdef __cplusplus
extern "C" {
#endif

/* Return codes. The first seven are the agent's (the wire's codes). */
#define CAIRN_OK 0
#define CAIRN_EBADREQUEST (-1)  /* bad_request: a malformed request (a kind or message too long, ...) */
#define CAIRN_EFORBIDDEN (-2)   /* forbidden: it named another job or rank than the caller's */
#define CAIRN_ENOTFOUND (-3)    /* not_found: an unknown ticket */
#define CAIRN_ERATELIMITED (-4) /* rate_limited: too many events; try later */
#define CAIRN_EUNAVAILABLE (-5) /* unavailable: the agent cannot reach the coordinator now */
#define CAIRN_EABORTED (-6)     /* aborted: the checkpoint asked for was aborted */
#define CAIRN_ECONFLICT (-7)    /* conflict: the job cannot be checkpointed now */
#define CAIRN_ENOENDPOINT (-8)  /* no socket directory: not in a rank of cairn's */
#define CAIRN_EPROTO (-9)       /* a reply this library does not understand */
#define CAIRN_ESYS (-10)        /* a system call failed; cairn_last_error() says which */
#define CAIRN_EINVAL (-11)      /* a bad argument (NULL, a socket path too long) */
#define CAIRN_EBUSY (-12)       /* cairn_watch: already watching; cairn_unwatch: called from a callback */

/* Sizes of the strings in struct cairn_info, NUL included. */
#define CAIRN_JOB_MAX 64
#define CAIRN_MODE_MAX 16

/* Where the rank stands. */
struct cairn_info {
	char job[CAIRN_JOB_MAX];   /* the job's name */
	int rank;                  /* this rank, 0 to size-1 */
	int size;                  /* the job's ranks */
	char mode[CAIRN_MODE_MAX]; /* "transparent" (CRIU) or "app" (application-level) */
	int ckpt;                  /* the job's newest durable checkpoint (0: none yet) */
	int restored;              /* 1 if this rank's processes were restored, else 0 */
	int restored_from;         /* the checkpoint they were restored from (0: started afresh) */
	int incarnation;           /* the rank's runs: 1 for the first, one more with every restore */
};

/* Outcomes of a checkpoint (struct cairn_result's state). */
#define CAIRN_DONE 1     /* the checkpoint was taken: ckpt */
#define CAIRN_RESTORED 2 /* this rank runs restored from checkpoint restored_from */

/* The outcome of a checkpoint the rank asked for. */
struct cairn_result {
	int state;         /* CAIRN_DONE or CAIRN_RESTORED */
	int ckpt;          /* CAIRN_DONE: the checkpoint taken */
	int restored_from; /* CAIRN_RESTORED: the checkpoint this rank was restored from */
};

/*
 * cairn_info fills *out with where the rank stands: its job, rank and size,
 * the job's mode and newest checkpoint, whether it runs restored (and from
 * which checkpoint), and its incarnation.
 */
int cairn_info(struct cairn_info *out);

/*
 * cairn_checkpoint asks for a global checkpoint of the rank's job (every
 * rank, two-phase commit) and waits for its outcome, polling it every
 * 50 ms. The rank is frozen and dumped with the others meanwhile. Like
 * fork, the call returns twice: once after the checkpoint (out->state
 * CAIRN_DONE, out->ckpt the checkpoint taken), and once more in a rank
 * restored from that checkpoint, later, on whichever node (CAIRN_RESTORED,
 * out->restored_from). A round that aborted is CAIRN_EABORTED; a job that
 * cannot be checkpointed now, CAIRN_ECONFLICT. out may be NULL.
 */
int cairn_checkpoint(struct cairn_result *out);

/*
 * cairn_stop asks for a checkpoint of the rank's job after which the job is
 * stopped (its ranks killed), as `cairn checkpoint` then `cairn kill` would.
 * Once the checkpoint is durable the caller is killed with the other ranks,
 * so the call does not return, but in a rank restored from that checkpoint
 * (CAIRN_RESTORED), or with an error (the round aborted: CAIRN_EABORTED).
 * out may be NULL.
 */
int cairn_stop(struct cairn_result *out);

/*
 * cairn_checkpoint_as is cairn_checkpoint with job named in the request.
 * For tests: naming a job is never needed, and anything but the caller's
 * own job is refused (CAIRN_EFORBIDDEN).
 */
int cairn_checkpoint_as(const char *job, struct cairn_result *out);

/*
 * cairn_event publishes an event of type rank.event on the cluster's event
 * stream, with the job, the rank, kind (1-32 letters, digits, '.', '-',
 * '_') and message (at most 1,024 bytes of UTF-8; NULL for none). A job may
 * publish 10 events a second, in bursts of 20; beyond that,
 * CAIRN_ERATELIMITED. A kind or message out of bounds is CAIRN_EBADREQUEST.
 */
int cairn_event(const char *kind, const char *message);

/* What cairn_watch calls, each with cb->arg; NULL ones are skipped. */
struct cairn_callbacks {
	/*
	 * prepare runs before the rank is frozen for checkpoint ckpt (or a
	 * migration): flush, quiesce, close connections to outside services;
	 * in mode "app", save the rank's state to its files. It has the watch's
	 * deadline_ms (or less, what the round has left). Returning 0 answers
	 * ready; anything else leaves the prepare unanswered, and the round
	 * fails (the job runs on).
	 */
	int (*prepare)(int ckpt, const char *mode, void *arg);
	/*
	 * resumed runs when the rank runs on, not restored, after a prepare or
	 * a checkpoint: ckpt is the job's newest checkpoint, the prepare's if
	 * it was taken, an older one if the round aborted.
	 */
	void (*resumed)(int ckpt, void *arg);
	/*
	 * restored runs when the rank runs restored from checkpoint
	 * restored_from (a new incarnation): reconnect to outside services.
	 */
	void (*restored)(int restored_from, void *arg);
	void *arg;
};

/*
 * cairn_watch starts a thread of the library's that registers the rank to
 * be told before its job's checkpoints, with deadline_ms for prepare (0:
 * what the round has left), and calls *cb back around them (*cb is copied).
 * It returns once the rank is registered. When the agent closes the watch
 * connection (the rank is frozen) the thread watches again every 50 ms
 * until the endpoint is back and, comparing the agent's reply with the
 * previous one, calls restored (the rank was restored) or resumed. The
 * thread blocks every signal. One watch at a time: CAIRN_EBUSY if one runs.
 */
int cairn_watch(const struct cairn_callbacks *cb, int deadline_ms);

/*
 * cairn_unwatch stops the thread of cairn_watch and waits for it; 0 if none
 * runs. Not from a callback (CAIRN_EBUSY).
 */
int cairn_unwatch(void);

/* cairn_strerror says what a return code means (a static string). */
const char *cairn_strerror(int code);

/*
 * cairn_last_error says what went wrong in the calling thread's last failed
 * call: the agent's message, or the system call that failed; "" if none.
 * The string is the thread's, valid until its next call of libcairn.
 */
const char *cairn_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* CAIRN_H */
