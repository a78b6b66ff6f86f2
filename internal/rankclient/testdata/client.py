"""client.py: the Python module against ranktest's fake endpoint, driven by
clients_test.go: each step prints one line, the same lines client.c prints.
With "noendpoint", only a call without an endpoint."""

import sys
import threading

import cairn

out = threading.Lock()


def say(*args):
    with out:
        print(*args, flush=True)


def info():
    try:
        i = cairn.info()
    except cairn.CairnError as e:
        say("info error", e.code)
        return
    say("info job=%s rank=%d size=%d mode=%s ckpt=%d restored=%d restored_from=%d incarnation=%d"
        % (i.job, i.rank, i.size, i.mode, i.ckpt, i.restored, i.restored_from, i.incarnation))


def result(what, call):
    try:
        r = call()
    except cairn.CairnError as e:
        say(what, "error", e.code)
        return
    if r.restored:
        say(what, "restored", r.restored_from)
    else:
        say(what, "done", r.ckpt)


def event(kind, message):
    try:
        cairn.event(kind, message)
    except cairn.CairnError as e:
        say("event error", e.code)
        return
    say("event ok")


def main():
    if sys.argv[1:] == ["noendpoint"]:
        info()
        return
    info()
    for _ in range(4):
        result("checkpoint", cairn.checkpoint)
    result("checkpoint_as", lambda: cairn.checkpoint(job="other"))
    result("stop", cairn.stop)
    info()
    event("phase.x-1_y", "quote \" backslash \\ newline \n tab \t unicode \u00e9 \u2713 ctrl \x01 end")
    event("a b", "agent refuses")
    event("k" * 33, "library refuses")
    ok = limited = 0
    for _ in range(25):
        try:
            cairn.event("burst", "n")
            ok += 1
        except cairn.CairnError as e:
            if e.code == "rate_limited":
                limited += 1
    say("events ok=%d limited=%d" % (ok, limited))

    cairn.watch(
        prepare=lambda ckpt, mode: say("prepare", ckpt, mode),
        resumed=lambda ckpt: say("resumed", ckpt),
        restored=lambda frm: say("restored", frm),
        deadline_ms=2000,
    )
    try:
        cairn.watch()
        busy = 0
    except cairn.CairnError as e:
        busy = int(e.code == "busy")
    say("watching", busy)
    for _ in sys.stdin:
        pass
    cairn.unwatch()
    say("unwatched 0")


main()
