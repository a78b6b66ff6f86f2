package ringapp

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"time"

	rankv1 "github.com/cairn-hpc/cairn/api/rank/v1"
)

// reporter publishes a rank's progress on the cluster's event stream
// through the rank API (docs/rank-api.md, "Progress"): events of kind
// progress whose message is the number of messages handled so far. It
// sends from a goroutine of its own, never on the ring's path: a count
// that comes while the previous one is still on its way is dropped, and
// one that cannot be sent (the rank is being checkpointed, the socket is
// gone) is lost, not retried.
type reporter struct {
	socket string
	counts chan int
}

func newReporter(socket string) *reporter {
	r := &reporter{socket: socket, counts: make(chan int, 1)}
	go r.run()
	return r
}

// report hands n to the sender unless it is busy.
func (r *reporter) report(n int) {
	select {
	case r.counts <- n:
	default:
	}
}

func (r *reporter) close() { close(r.counts) }

func (r *reporter) run() {
	for n := range r.counts {
		_ = publishProgress(r.socket, n)
	}
}

// publishProgress sends one progress event over the rank API's socket.
func publishProgress(socket string, n int) error {
	conn, err := net.DialTimeout("unix", socket, time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	req, _ := json.Marshal(rankv1.Request{Op: rankv1.OpEvent, Kind: rankv1.KindProgress, Message: strconv.Itoa(n)})
	if _, err := conn.Write(append(req, '\n')); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadBytes('\n')
	if err != nil {
		return err
	}
	var rep rankv1.Reply
	if err := json.Unmarshal(line, &rep); err != nil {
		return err
	}
	if !rep.OK {
		return fmt.Errorf("%s: %s", rep.Code, rep.Error)
	}
	return nil
}
