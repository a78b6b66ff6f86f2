"""cairn: the Python client of cairn's rank API (docs/rank-api.md).

A program in a rank of a cairn job talks to its node's agent through a unix
socket in its container ($CAIRN_SOCKET, else /run/cairn/rank.sock):

    import cairn
    print(cairn.info())                  # Info(job='sim', rank=2, size=4, ...)
    r = cairn.checkpoint()               # a global checkpoint of the job, now
    if r.restored:                       # returns twice, like fork:
        print("restored from", r.restored_from)
    else:
        print("checkpoint", r.ckpt, "done")
    cairn.event("phase", "step 1000 done")
    cairn.watch(prepare=..., resumed=..., restored=...)

Standard library only (Python 3.11, Debian 12's). setup.sh installs it as
/opt/cairn/python/cairn.py: put that directory on sys.path or PYTHONPATH.

While the endpoint is away (the socket is removed while the rank is frozen
for a checkpoint or a migration; a connection closed before its reply) a
call tries again every 50 ms, for as long as it takes; a checkpoint or an
event sent again carries the id of its first try, so the agent carries it
out once. A call fails at once, with
code "no_endpoint", if the socket's directory does not exist (not in a rank
of cairn's).

Errors are CairnError, whose .code is the agent's (bad_request, forbidden,
not_found, rate_limited, unavailable, aborted, conflict) or the client's
(no_endpoint, protocol, busy).
"""

# The release this client belongs to; `make dist` sets it from the tag.
__version__ = "0.0.0.dev0"

import json
import os
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass

__all__ = ["CairnError", "Info", "Result", "info", "checkpoint", "stop", "event", "watch", "unwatch"]

SOCKET_PATH = "/run/cairn/rank.sock"
MAX_LINE = 64 * 1024  # a message, newline included
MAX_KIND = 32
MAX_MESSAGE = 1024
RETRY = 0.05  # seconds between tries while the endpoint is away


class CairnError(Exception):
    """An error of the rank API: .code says which, .message what."""

    def __init__(self, code, message=""):
        super().__init__(message or code)
        self.code = code
        self.message = message or code


@dataclass(frozen=True)
class Info:
    """Where the rank stands."""

    job: str
    rank: int
    size: int
    mode: str  # "transparent" (CRIU) or "app" (application-level)
    ckpt: int  # the job's newest durable checkpoint (0: none yet)
    restored: bool  # this rank's processes were restored
    restored_from: int  # the checkpoint they were restored from (0: started afresh)
    incarnation: int  # the rank's runs: 1 for the first, one more with every restore


@dataclass(frozen=True)
class Result:
    """The outcome of a checkpoint the rank asked for: state "done" (ckpt
    was taken) or "restored" (this rank runs restored from restored_from)."""

    state: str
    ckpt: int = 0
    restored_from: int = 0

    @property
    def restored(self):
        return self.state == "restored"


class _Away(Exception):
    """The endpoint is away for now: try again."""


def _path():
    return os.environ.get("CAIRN_SOCKET") or SOCKET_PATH


def _encode(req):
    line = json.dumps(req, separators=(",", ":")).encode() + b"\n"
    if len(line) > MAX_LINE:
        raise CairnError("bad_request", "request longer than 64 KiB")
    return line


def _read_line(f):
    """One message from f; _Away if the connection closes before it."""
    try:
        line = f.readline(MAX_LINE + 1)
    except (ConnectionResetError, BrokenPipeError) as e:
        raise _Away() from e
    if not line.endswith(b"\n"):
        if len(line) > MAX_LINE:
            raise CairnError("protocol", "message from the agent longer than 64 KiB")
        raise _Away()
    try:
        msg = json.loads(line)
    except ValueError as e:
        raise CairnError("protocol", "malformed message from the agent: %.80r" % line) from e
    if not isinstance(msg, dict):
        raise CairnError("protocol", "message from the agent not an object: %.80r" % line)
    return msg


def _try(line):
    """Sends line on a new connection and reads the reply: (sock, file, reply)."""
    path = _path()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError, BlockingIOError) as e:
            if not os.path.isdir(os.path.dirname(path) or "."):
                raise CairnError("no_endpoint", "no rank endpoint at %s: not in a rank of cairn's" % path) from e
            raise _Away() from e
        try:
            sock.sendall(line)
        except (BrokenPipeError, ConnectionResetError) as e:
            raise _Away() from e
        f = sock.makefile("rb")
        return sock, f, _read_line(f)
    except BaseException:
        sock.close()
        raise


def _open(req, stopping=None):
    """Sends req and reads its reply, trying again every 50 ms while the
    endpoint is away: (sock, file, reply); an error reply raises."""
    line = _encode(req)
    while True:
        try:
            sock, f, reply = _try(line)
            break
        except _Away:
            if stopping is not None and stopping():
                raise CairnError("stopped", "watch stopped")
            time.sleep(RETRY)
    if not reply.get("ok"):
        f.close()
        sock.close()
        raise CairnError(reply.get("code") or "protocol", reply.get("error") or "")
    return sock, f, reply


def _call(req):
    sock, f, reply = _open(req)
    f.close()
    sock.close()
    return reply


def _request(op, job, **fields):
    req = {"op": op}
    if job is not None:
        req["job"] = job
    req.update(fields)
    return req


def _new_id():
    """Names a request that changes something: sent again after its
    connection closed, it is carried out once (docs/rank-api.md)."""
    return os.urandom(12).hex()


def _info(reply):
    return Info(
        job=reply.get("job") or "",
        rank=reply.get("rank") or 0,
        size=reply.get("size") or 0,
        mode=reply.get("mode") or "",
        ckpt=reply.get("ckpt") or 0,
        restored=bool(reply.get("restored")),
        restored_from=reply.get("restored_from") or 0,
        incarnation=reply.get("incarnation") or 0,
    )


def info(job=None):
    """Where the rank stands: an Info.

    job, for tests: names a job in the request; anything but the caller's
    own is refused (CairnError code "forbidden").
    """
    return _info(_call(_request("info", job)))


def _checkpoint(job, stop):
    fields = {"stop": True} if stop else {}
    ticket = _call(_request("checkpoint", job, id=_new_id(), **fields)).get("ticket")
    if not ticket:
        raise CairnError("protocol", "checkpoint reply without a ticket")
    while True:
        reply = _call(_request("result", job, ticket=ticket))
        state = reply.get("state")
        if state == "done":
            return Result("done", ckpt=reply.get("ckpt") or 0)
        if state == "restored":
            return Result("restored", restored_from=reply.get("restored_from") or 0)
        if state != "pending":
            raise CairnError("protocol", "checkpoint %s: unknown state %r" % (ticket, state))
        time.sleep(RETRY)


def checkpoint(job=None):
    """Asks for a global checkpoint of the rank's job and waits for its
    outcome, a Result. The rank is frozen and dumped with the others
    meanwhile. Like fork, the call returns twice: once after the checkpoint
    (state "done", ckpt), and once more in a rank restored from it (state
    "restored", restored_from). A round that aborted raises CairnError
    "aborted"; a job that cannot be checkpointed now, "conflict".

    job, for tests: names a job in the request; anything but the caller's
    own is refused (CairnError code "forbidden").
    """
    return _checkpoint(job, False)


def stop(job=None):
    """Asks for a checkpoint of the rank's job after which the job is
    stopped (its ranks killed). Once the checkpoint is durable the caller is
    killed with the others: stop returns only in a rank restored from that
    checkpoint (a Result, state "restored"), or raises (the round aborted).
    """
    return _checkpoint(job, True)


def event(kind, message="", job=None):
    """Publishes an event of type rank.event on the cluster's event stream,
    with the job, the rank, kind (1-32 letters, digits, '.', '-', '_') and
    message (at most 1,024 bytes of UTF-8). A job may publish 10 events a
    second, in bursts of 20; beyond that, CairnError "rate_limited".
    """
    if not kind or len(kind.encode()) > MAX_KIND:
        raise CairnError("bad_request", "event kind of %d bytes: 1 to %d" % (len(kind.encode()), MAX_KIND))
    if len(message.encode()) > MAX_MESSAGE:
        raise CairnError("bad_request", "event message of %d bytes: at most %d" % (len(message.encode()), MAX_MESSAGE))
    _call(_request("event", job, id=_new_id(), kind=kind, message=message))


class _Watch:
    """The watch thread and what it shares."""

    def __init__(self, prepare, resumed, restored, deadline_ms):
        self.prepare, self.resumed, self.restored = prepare, resumed, restored
        self.deadline_ms = deadline_ms
        self.lock = threading.Lock()
        self.stop = False
        self.sock = None
        self.registered = threading.Event()
        self.error = None
        self.thread = threading.Thread(target=self.run, name="cairn-watch", daemon=True)

    def stopping(self):
        with self.lock:
            return self.stop

    def run(self):
        req = {"op": "watch", "prepare": True}
        if self.deadline_ms:
            req["deadline_ms"] = self.deadline_ms
        prev = None
        prepared = False
        while not self.stopping():
            try:
                sock, f, reply = _open(req, self.stopping)
            except CairnError as e:
                if prev is None:
                    self.error = e
                    self.registered.set()
                    return
                if e.code == "stopped":
                    return
                time.sleep(RETRY)  # an error reply, say: try again, patiently
                continue
            with self.lock:
                self.sock = sock
                stop = self.stop
            if stop:
                sock.close()
                return
            cur = _info(reply)
            # Where the rank stands now, against the previous reply.
            if prev is not None and cur.incarnation > prev.incarnation:
                if self.restored:
                    self.restored(cur.restored_from)
            elif prev is not None and (cur.ckpt > prev.ckpt or prepared):
                if self.resumed:
                    self.resumed(cur.ckpt)
            prev = cur
            self.registered.set()
            prepared = self.events(sock, f, cur.mode)
            with self.lock:
                self.sock = None
            f.close()
            sock.close()
            if not self.stopping():
                time.sleep(RETRY)

    def events(self, sock, f, mode):
        """Answers prepare events until the agent closes the connection;
        reports whether a prepare came."""
        prepared = False
        while True:
            try:
                ev = _read_line(f)
            except (_Away, CairnError, OSError):
                return prepared
            if ev.get("event") != "prepare":
                continue  # not an event of this version's
            prepared = True
            if self.prepare:
                try:
                    ok = self.prepare(ev.get("ckpt") or 0, ev.get("mode") or mode)
                except Exception:
                    traceback.print_exc(file=sys.stderr)
                    return prepared
                if ok is False:
                    return prepared
            try:
                sock.sendall(b'{"op":"ready"}\n')
            except OSError:
                return prepared


_watch = None
_watch_lock = threading.Lock()


def watch(prepare=None, resumed=None, restored=None, deadline_ms=5000):
    """Starts a daemon thread that registers the rank to be told before its
    job's checkpoints and calls back around them; returns once registered.

    prepare(ckpt, mode) runs before the rank is frozen for checkpoint ckpt
    (or a migration): flush, quiesce, close connections to outside services;
    in mode "app", save the rank's state to its files. It has deadline_ms
    (or less, what the round has left). When it returns, the thread answers
    ready; if it returns False or raises, the prepare is left unanswered and
    the round fails (the job runs on).

    resumed(ckpt) runs when the rank runs on, not restored, after a prepare
    or a checkpoint: ckpt is the job's newest checkpoint, the prepare's if
    it was taken, an older one if the round aborted.

    restored(restored_from) runs when the rank runs restored from that
    checkpoint (a new incarnation): reconnect to outside services.

    Callbacks run on the watch thread, one at a time. One watch at a time:
    a second raises CairnError "busy".
    """
    global _watch
    with _watch_lock:
        if _watch is not None:
            raise CairnError("busy", "already watching")
        w = _Watch(prepare, resumed, restored, deadline_ms)
        w.thread.start()
        w.registered.wait()
        if w.error is not None:
            w.thread.join()
            raise w.error
        _watch = w


def unwatch():
    """Stops the watch thread and waits for it (not from a callback)."""
    global _watch
    with _watch_lock:
        w = _watch
        if w is None:
            return
        if threading.current_thread() is w.thread:
            raise CairnError("busy", "unwatch from a callback")
        _watch = None
    with w.lock:
        w.stop = True
        if w.sock is not None:
            try:
                w.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
    w.thread.join()
