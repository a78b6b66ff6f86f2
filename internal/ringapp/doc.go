// Package ringapp is a deterministic, communication-heavy test job, used by
// cairn's end-to-end tests and benchmarks to show that a checkpoint of a
// whole job loses and duplicates nothing that was in flight between its
// ranks. It runs as `cairn ringapp` in every rank's container.
//
// The ranks form a ring over TCP: each rank connects to the next one (its
// downstream) and accepts a connection from the previous one (its
// upstream). Messages numbered 0..messages-1 go around the ring at a high
// rate, so that at every moment some are in the senders' and receivers'
// socket buffers and in the ranks' own buffers. A test checkpoints the job
// while it runs, kills it, restores it (possibly on other nodes, with the
// same addresses) and compares rank 0's result with Expected.
//
// Vocabulary:
//
//   - A message carries its sequence number (seq), a 64-bit value, its
//     sender's rank, a payload derived from seq and sender, and a CRC-32C
//     of all that.
//   - Rank 0 keeps a window of messages in flight. It starts with messages
//     0..window-1, with values derived from the seed. When message j comes
//     back from the last rank, it folds j's value into the result and, if
//     j+window < messages, sends message j+window with a value derived from
//     j's. Every other rank receives message j, checks it, mixes its rank
//     into the value, and sends it on. Every rank handles exactly messages
//     messages, so the result depends on every value that went round.
//   - The result is a 64-bit word, printed as 16 hex digits. Expected
//     computes it without any network.
//
// A rank checks that the messages from its upstream arrive in order, each
// once, intact. Anything else ends it with ErrCorrupt, ErrLost or
// ErrDuplicate. At the end, each rank confirms to its upstream that
// everything arrived before either end closes the link, so every rank
// exits 0 only after the whole run went through.
//
// After the ring is connected, nothing depends on the wall clock: no read
// deadlines, no keepalives, no timers besides progress output, no busy
// loops waiting for something. A rank can be frozen and checkpointed at any
// point, for any time.
//
// Wire format, little-endian. A rank opens its link downstream with a
// hello, so that both ends can check that they are neighbours in the same
// run:
//
//	"cairnrng" version:u32 rank:u32 size:u32 payload:u32 window:u32 0:u32 messages:u64 fnv64a(job):u64
//
// then sends messages:
//
//	seq:u64 value:u64 sender:u32 payload-length:u32 payload crc32c(all before):u32
//
// and at the end reads the confirmation its downstream sends back on the
// same connection: "ringdone" count:u64.
//
// Output lines (stdout):
//
//	rank R/N: listening on ADDR
//	rank R/N: ring connected (upstream ADDR, downstream ADDR)
//	rank R: K/M msgs            every -progress
//	rank 0: holding after K msgs  with -hold K, until SIGUSR1
//	rank 0: released
//	rank R: done M msgs
//	result=HEX                  rank 0, at the end (also in -out)
//	FAIL rank R: REASON         before a non-zero exit
//
// Rank 0 also publishes its count of messages at every -progress through
// the rank API's socket ($CAIRN_SOCKET, or its usual path in a rank of a
// job), as events of kind progress (docs/rank-api.md), from a goroutine
// of its own: a report that cannot be sent is dropped, never retried, and
// the ring never waits for one. -report=false turns this off.
//
// Exit codes: 0 done; 1 error (connecting, I/O); 2 bad flags or
// environment; 3 a corrupt, lost or duplicate message; 128+n on signal n
// (SIGTERM, SIGINT).
package ringapp
