#!/usr/bin/python3
"""watch.py: a rank that keeps a TCP connection to another service across
checkpoints, with the rank API's callbacks.

A connection to a process outside the job cannot be in a checkpoint that may
be restored elsewhere, later. So each client rank closes its connection
before a checkpoint (prepare) and opens it again when it runs on (resumed)
or runs restored (restored). Every step it sends a numbered message; the
server checks that each rank's numbers come in order, without a gap: after
a restore a rank starts again from its checkpoint's step, which the server
takes as a rewind (and says so), never as a gap.

    cairn run --job w --ranks 3 --checkpoint-every 20s -- /usr/bin/python3 watch.py

The server is at $WATCH_SERVER (HOST:PORT; "gateway:PORT" is the rank's
own node, at its job network's gateway: a node-local service the agents
open with --allow-host-port PORT, on every node). Without it, the job's
last rank is the server (on port 7000) and the others connect to it; then
the server is checkpointed with the job, and a restore rewinds it too.
"""

import argparse
import ipaddress
import os
import socket
import sys
import threading
import time

sys.path.append("/opt/cairn/python")
import cairn  # noqa: E402

PORT = 7000


def say(*args):
    print(*args, flush=True)


class Link:
    """The client's connection to the server, closed while the rank is frozen."""

    def __init__(self, addr, rank):
        self.addr, self.rank = addr, rank
        self.cond = threading.Condition()
        self.sock = None
        self.next = 1  # the next message's number

    def open(self):
        with self.cond:
            for _ in range(300):  # the server may start after us
                try:
                    self.sock = socket.create_connection(self.addr)
                    break
                except OSError:
                    time.sleep(0.1)
            else:
                raise SystemExit(f"rank {self.rank}: cannot connect to {self.addr}")
            self.sock.sendall(f"hello {self.rank} {self.next}\n".encode())
            self.cond.notify_all()

    def close(self):
        with self.cond:
            if self.sock is not None:
                self.sock.close()
                self.sock = None

    def send(self, line, number):
        with self.cond:
            while self.sock is None:  # frozen meanwhile: wait for resumed or restored
                self.cond.wait()
            self.sock.sendall(line.encode())
            self.next = number + 1

    # The rank API's callbacks (on cairn's watch thread).
    def prepare(self, ckpt, mode):
        self.close()
        say(f"rank {self.rank}: closed the connection for checkpoint {ckpt}")

    def resumed(self, ckpt):
        self.open()
        say(f"rank {self.rank}: reconnected, running on (newest checkpoint {ckpt})")

    def restored(self, restored_from):
        self.open()
        say(f"rank {self.rank}: reconnected, restored from checkpoint {restored_from}")


def client(addr, rank, steps, sleep):
    link = Link(addr, rank)
    link.open()
    cairn.watch(prepare=link.prepare, resumed=link.resumed, restored=link.restored)
    for step in range(1, steps + 1):
        link.send(f"{rank} {step}\n", step)
        if step % 100 == 0:
            say(f"rank {rank}: sent {step}")
        time.sleep(sleep)
    link.send(f"bye {rank} {steps}\n", steps)
    say(f"rank {rank}: done, {steps} messages")


class Server:
    """Checks every client's numbers: in order, without a gap."""

    def __init__(self, clients):
        self.clients = clients
        self.lock = threading.Lock()
        self.want = {}  # rank -> the number expected next
        self.current = {}  # rank -> the Event its current connection sets when it ends
        self.done = set()
        self.errors = 0
        self.finished = threading.Event()

    def fail(self, msg):
        say("server: error:", msg)
        self.errors += 1

    def hello(self, rank, n, ended):
        # A rank's earlier connection ends first: its last lines come first.
        with self.lock:
            before = self.current.get(rank)
        if before is not None:
            before.wait(10)
        with self.lock:
            self.current[rank] = ended
            want = self.want.get(rank, 1)
            if n > want:
                self.fail(f"rank {rank} resumes at {n}: {want}..{n - 1} are lost")
            elif n < want:
                say(f"server: rank {rank} rewound from {want} to {n}: it was restored")
            self.want[rank] = n

    def line(self, rank, words):
        with self.lock:
            n = int(words[-1])
            if words[0] == "bye":
                if self.want.get(rank) != n + 1:
                    self.fail(f"rank {rank} ends at {n}, after {self.want.get(rank, 1) - 1}")
                say(f"server: rank {rank}: {n} messages in order")
                self.done.add(rank)
                if len(self.done) == self.clients:
                    self.finished.set()
            elif n != self.want.get(rank):
                self.fail(f"rank {rank} sent {n}, want {self.want.get(rank)}")
            else:
                self.want[rank] = n + 1

    def conn(self, sock):
        ended = threading.Event()
        try:
            with sock, sock.makefile("r") as f:
                rank = None
                for line in f:
                    words = line.split()
                    if words[0] == "hello":
                        rank = int(words[1])
                        self.hello(rank, int(words[2]), ended)
                    elif rank is not None:
                        self.line(rank, words)
        finally:
            ended.set()

    def run(self, port):
        srv = socket.create_server(("", port))
        say(f"server: listening on port {port} for {self.clients} ranks")
        threading.Thread(target=self.accept, args=(srv,), daemon=True).start()
        self.finished.wait()
        say("server: OK" if self.errors == 0 else f"server: {self.errors} errors")
        return 1 if self.errors else 0

    def accept(self, srv):
        while True:
            sock, _ = srv.accept()
            threading.Thread(target=self.conn, args=(sock,), daemon=True).start()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--sleep-ms", type=int, default=100)
    p.add_argument("--serve", type=int, metavar="CLIENTS", help="be the server, for CLIENTS ranks")
    a = p.parse_args()
    rank, size = int(os.environ.get("CAIRN_RANK", "0")), int(os.environ.get("CAIRN_SIZE", "1"))
    server = os.environ.get("WATCH_SERVER")
    if a.serve is not None:
        sys.exit(Server(a.serve).run(PORT if not server else int(server.rsplit(":", 1)[1])))
    if not server:
        if rank == size - 1:
            sys.exit(Server(size - 1).run(PORT))
        server = f"{os.environ['CAIRN_PEERS'].split(',')[-1]}:{PORT}"
    host, port = server.rsplit(":", 1)
    if host == "gateway":
        # The job subnet's first host address: the gateway on every node.
        net = ipaddress.ip_network(os.environ["CAIRN_SUBNET"])
        host = str(net.network_address + 1)
    client((host, int(port)), rank, a.steps, a.sleep_ms / 1000)


main()
