package rankclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Usage is cairn rank's help.
const Usage = `Usage: cairn rank info|checkpoint|stop|event KIND MESSAGE [--json] [--job JOB]

Talk to cairn from inside a rank of a job, through the rank API's socket
($CAIRN_SOCKET, else /run/cairn/rank.sock; docs/rank-api.md). Every rank has
this binary as /.cairn/cairn.

  info        where the rank stands: job, rank, size, mode, the job's newest
              checkpoint, whether the rank runs restored (and from which
              checkpoint), its incarnation
  checkpoint  take a global checkpoint of the job now, and wait for it. Like
              fork, it returns twice: "checkpoint N done" after the
              checkpoint, and "restored from checkpoint N" in a rank restored
              from it
  stop        the same, then the job is stopped (its ranks killed): it
              returns only in a rank restored from that checkpoint
  event KIND MESSAGE
              publish a rank.event on the cluster's event stream. KIND: 1-32
              letters, digits, '.', '-', '_'; MESSAGE: at most 1,024 bytes.
              A job may publish 10 a second, in bursts of 20

While the socket is away (the rank is frozen for a checkpoint) it tries
again every 50 ms.

Flags:
  --json      print JSON
  --job JOB   name JOB in the requests: never needed, and the agent refuses
              any job but the rank's own (forbidden, exit code 1)

Exit codes: 0 ok; 1 an error: the round aborted, the job cannot be
checkpointed now, too many events, the agent refused (forbidden), no
endpoint (not in a rank); 2 a wrong call, or a request the agent finds
malformed (bad_request); 130 interrupted.`

// ErrUsage: the words are not a rank command.
var ErrUsage = errors.New("see 'cairn rank --help'")

// Published says an event went out.
type Published struct {
	Kind string `json:"kind"`
}

func (p Published) String() string { return "published " + p.Kind }

// Main is cairn rank: it parses args (the words after "rank", flags
// anywhere before "--"), runs the command and writes what it shows to w.
// A wrong call is an error wrapping ErrUsage.
func Main(ctx context.Context, args []string, w io.Writer) error {
	c := New()
	asJSON := false
	var words []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			words = append(words, args[i+1:]...)
			i = len(args)
		case a == "-h" || a == "--help" || a == "help":
			_, err := fmt.Fprintln(w, Usage)
			return err
		case a == "--json":
			asJSON = true
		case a == "--job" && i+1 < len(args):
			i++
			c.Job = args[i]
		case strings.HasPrefix(a, "--job="):
			c.Job = strings.TrimPrefix(a, "--job=")
		case strings.HasPrefix(a, "-") && a != "-":
			return fmt.Errorf("cairn rank: unknown flag %s, or a flag without its value: %w", a, ErrUsage)
		default:
			words = append(words, a)
		}
	}
	out, err := Command(ctx, c, words)
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	_, err = fmt.Fprintln(w, out)
	return err
}

// Command runs the rank command words names: info, checkpoint, stop, or
// event KIND MESSAGE. It returns what to show: an Info, a Result or a
// Published.
func Command(ctx context.Context, c *Client, words []string) (fmt.Stringer, error) {
	switch {
	case len(words) == 1 && words[0] == "info":
		return c.Info(ctx)
	case len(words) == 1 && (words[0] == "checkpoint" || words[0] == "stop"):
		return c.Checkpoint(ctx, words[0] == "stop")
	case len(words) == 3 && words[0] == "event":
		return Published{words[1]}, c.Event(ctx, words[1], words[2])
	}
	return nil, fmt.Errorf("cairn rank %s: want info, checkpoint, stop or event KIND MESSAGE: %w", strings.Join(words, " "), ErrUsage)
}
